"""``python -m llm_server {serve,handwritten} [--port P] [--size S] [--model M]``."""
import sys

from ray_lite._examples.llm_server.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
