"""The OpenAI-compatible request and response bodies (the subset this server
implements), with vLLM's field names and defaults.  Unknown fields are
accepted and ignored, as vLLM's server does."""
import time
import uuid
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: Optional[bool] = False


class CompletionRequest(_Body):
    model: Optional[str] = None
    # A text, or its tokens (this model's tokens are the UTF-8 bytes).
    prompt: Union[str, list[Annotated[int, Field(ge=0, le=255)]]]
    max_tokens: Optional[Annotated[int, Field(ge=1)]] = 16
    temperature: Optional[Annotated[float, Field(ge=0)]] = None    # greedy whatever it is
    n: Annotated[int, Field(ge=1, le=1)] = 1
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    echo: Optional[bool] = False
    seed: Optional[int] = None
    user: Optional[str] = None
    # Not OpenAI's: ray-lite bench llm asks for each chunk's timestamps (api.py).
    ray_lite_timing: Optional[bool] = False


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Body):
    model: Optional[str] = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Optional[Annotated[int, Field(ge=1)]] = None
    max_completion_tokens: Optional[Annotated[int, Field(ge=1)]] = None
    temperature: Optional[Annotated[float, Field(ge=0)]] = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    seed: Optional[int] = None
    user: Optional[str] = None
    # Not OpenAI's: ray-lite bench llm asks for each chunk's timestamps (api.py).
    ray_lite_timing: Optional[bool] = False


def chat_prompt(messages):
    """The prompt text of a conversation: one line per message, then the
    assistant's turn."""
    return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "


def new_id(prefix):
    return f"{prefix}-{uuid.uuid4().hex}"


def now():
    return int(time.time())


def error_body(message, status, param=None):
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``,
    ``type`` being the status's reason phrase."""
    from http import HTTPStatus
    return {"error": {"message": message, "type": HTTPStatus(status).phrase,
                      "param": param, "code": int(status)}}


def usage(prompt_tokens, completion_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
