"""``specdec serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn).

``create_app(llm, model_name, ...)`` builds the app; ``specdec.cli.serve`` runs it.
"""

from specdec.server.app import create_app

__all__ = ["create_app"]
