"""The messages between the API process and the engine-core process (MessagePack, msgspec-typed).

    API -> core (one socket, PUSH/PULL)      core -> API (one socket, PUSH/PULL)
      Add(requests)     validated Requests      Step(deltas, stats, failed)  one a step, every request's
      Abort(rids)       withdraw (client gone)                               new tokens in it
      Finish(rids)      a stop string was found  Result(call_id, value)      a utility call's answer
      Call(id, name)    reset_prefix_cache       Heartbeat(stats)            while idle, once a second
      Shutdown()

Every message is decoded against its type: a malformed frame raises msgspec.DecodeError or
ValidationError naming the problem, and the receiver drops it (logged), never its process.
"""
from __future__ import annotations

import msgspec

from radixkv.engine.core import EngineStats, RequestDelta
from radixkv.request import Request


class Add(msgspec.Struct, tag="add"):
    requests: list[Request]


class Abort(msgspec.Struct, tag="abort"):
    rids: list[int]


class Finish(msgspec.Struct, tag="finish"):
    rids: list[int]


class Call(msgspec.Struct, tag="call"):
    call_id: int
    name: str  # an EngineCore method that takes no argument: "reset_prefix_cache"


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


class Failed(msgspec.Struct):
    """Requests a failed step ended (the core withdrew them: pages released)."""

    rids: list[int]
    error: str


class Step(msgspec.Struct, tag="step"):
    deltas: list[RequestDelta]
    stats: EngineStats
    failed: list[Failed] = []


class Result(msgspec.Struct, tag="result"):
    call_id: int
    value: bool | int | float | str | None = None
    error: str | None = None


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    stats: EngineStats


ToCore = Add | Abort | Finish | Call | Shutdown
FromCore = Step | Result | Heartbeat

encoder = msgspec.msgpack.Encoder()
to_core = msgspec.msgpack.Decoder(ToCore)
from_core = msgspec.msgpack.Decoder(FromCore)
