"""OpenAI request and error shapes, validated by pydantic.

Unknown fields are refused (extra="forbid") and the known-but-unsupported ones (tools, echo, suffix, best_of)
get a clear 400: a client never gets an answer that silently ignored what it asked for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from specdecode.config import MAX_LOGPROBS, MAX_N, ConfigError, SamplingParams, StructuredOutputs

# Integers are lax: JSON's 16.0 is an integer to JSON Schema and to most clients; 16.5 and "many" still fail.
TokenId = Annotated[int, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]


class OpenAIError(Exception):
    """Becomes an OpenAI error body with this HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_
        self.param: str | None = extra.get("param")
        self.code: str | None = extra.get("code")
        self.headers: dict[str, str] = extra.get("headers") or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __reduce__(self):
        # Ray carries errors from a replica to the ingress; the default rebuilds from args (the message) alone.
        return (
            OpenAIError,
            (self.status, self.message, self.type),
            {"param": self.param, "code": self.code, "headers": self.headers},
        )


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Common(BaseModel):
    """Sampling fields shared by both endpoints; vLLM's extensions top_k and ignore_eos included."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None  # torch generators' range
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(ge=0.01, le=10.0)] | None = None  # vLLM's extension
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    ignore_eos: StrictBool = False

    def check_supported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options is only allowed with stream: true", param="stream_options")

    def token_bias(self) -> dict[int, float] | None:
        """logit_bias with its keys as token ids (JSON object keys are strings)."""
        if not self.logit_bias:
            return None
        try:
            return {int(k): v for k, v in self.logit_bias.items()}
        except ValueError:
            raise OpenAIError(400, "logit_bias keys must be token ids", param="logit_bias") from None

    def num_logprobs(self) -> int | None:
        return None

    def structured(self) -> StructuredOutputs | None:
        return None

    def sampling(self, max_tokens: int) -> SamplingParams:
        """Sampling parameters for the engine; OpenAI's default temperature is 1."""
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=max(self.top_k or 0, 0),
                max_tokens=max_tokens,
                seed=self.seed,
                stop=self.stop or None,
                ignore_eos=self.ignore_eos,
                n=self.n,
                presence_penalty=self.presence_penalty or 0.0,
                frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=self.repetition_penalty or 1.0,
                logit_bias=self.token_bias(),
                logprobs=self.num_logprobs(),
                structured_outputs=self.structured(),
            )
        except ConfigError as e:
            raise OpenAIError(400, str(e)) from e


class CompletionRequest(_Common):
    prompt: (
        Text | TokenIds | Annotated[list[Text], Field(min_length=1)] | Annotated[list[TokenIds], Field(min_length=1)]
    )
    echo: StrictBool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise OpenAIError(400, "echo is not supported", param="echo")
        if self.suffix:
            raise OpenAIError(400, "suffix is not supported", param="suffix")
        if self.best_of not in (None, self.n):
            raise OpenAIError(400, "best_of other than n is not supported", param="best_of")

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        """One prompt per request (as n = 1): a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise OpenAIError(400, "batched prompts are not supported; send one request per prompt", "prompt")
            p = p[0]
        if not p:
            raise OpenAIError(400, "prompt is empty", param="prompt")
        return p


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, json_object (any JSON object) or json_schema (JSON valid for a schema)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart]
    name: str | None = None

    def as_template_dict(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: ResponseFormat | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.tools or self.tool_choice not in (None, "none"):
            raise OpenAIError(400, "tools are not supported", param="tools")

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured(self) -> StructuredOutputs | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputs(json_object=True)
        if fmt.json_schema is None:
            raise OpenAIError(400, "response_format json_schema needs a json_schema object", param="response_format")
        return StructuredOutputs(json=fmt.json_schema.schema_)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
