"""An OpenAI-compatible streaming LLM server on ray_lite: see docs/llm-server.md.

    python -m llm_server serve --port 8000 --size small      # from this folder's parent
    ray-lite serve run llm_server:build size=small --app-dir examples

The code ships inside ray_lite (``ray_lite._examples.llm_server``), so that
``ray-lite bench llm`` runs it from an installed package too; this package
is its entry point here and exports what a program needs.
"""
from ray_lite._examples.llm_server import api, deployments, engine, model, protocol  # noqa: F401
from ray_lite._examples.llm_server.deployments import build  # noqa: F401
