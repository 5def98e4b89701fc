"""``specdec serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn).

``create_app(llm, model_name, ...)`` builds the app; ``serve(args)`` runs it from the CLI.
"""

from specdec.server.app import create_app, serve

__all__ = ["create_app", "serve"]
