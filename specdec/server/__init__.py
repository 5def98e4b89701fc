"""``specdec serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn).

``create_app(llm, model_name, ...)`` builds the app; ``specdec.cli.serve`` runs it with
``http=http_protocol(...)`` (the deadline for a request's headers).
"""

from specdec.server.app import create_app
from specdec.server.connection import http_protocol

__all__ = ["create_app", "http_protocol"]
