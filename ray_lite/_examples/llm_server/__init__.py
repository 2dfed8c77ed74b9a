"""An OpenAI-compatible streaming LLM server on ray_lite (a toy model, real
serving): see docs/llm-server.md.

    python -m ray_lite._examples.llm_server serve --port 8000 --size small
    python -m ray_lite._examples.llm_server handwritten --port 8000   # uvicorn + pipes
    python -m llm_server serve --port 8000          # the same, from the checkout's examples/

Modules: ``model`` (the numpy model and its shards), ``engine`` (continuous
batching), ``protocol`` and ``api`` (the OpenAI API on FastAPI),
``deployments`` (the server on Serve), ``handwritten`` (the same app on one
uvicorn process with ``multiprocessing`` workers), ``hf`` (a causal LM from
``transformers`` behind the same engine, when it is installed).
"""
