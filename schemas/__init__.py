"""Schemas: every message and the configuration, as msgspec Structs. Pure data, no I/O."""

from schemas.codec import Codec, DecodeError, codec_for, format_from_headers
from schemas.config import (
    Config,
    ConfigError,
    Endpoint,
    Org,
    Tier,
    Window,
    load_config,
    parse_config,
)
from schemas.messages import (
    AdmittedRequest,
    Batch,
    BatchTiming,
    DeadLetter,
    EmbedInput,
    LaneState,
    Request,
    RerankInput,
    Result,
    SchedulerState,
    WorkerEvent,
)
from schemas.topics import Topics

__all__ = [
    "AdmittedRequest",
    "Batch",
    "BatchTiming",
    "Codec",
    "Config",
    "ConfigError",
    "DeadLetter",
    "DecodeError",
    "EmbedInput",
    "Endpoint",
    "LaneState",
    "Org",
    "Request",
    "RerankInput",
    "Result",
    "SchedulerState",
    "Tier",
    "Topics",
    "Window",
    "WorkerEvent",
    "codec_for",
    "format_from_headers",
    "load_config",
    "parse_config",
]
