# test_driver.machine.qmp (nixpkgs nixos/lib/test-driver/src/test_driver/machine/qmp.py, read at
# 1fd39e0c4e0b0a90339715b7e41d7681bb23a99b): the QMP client a QemuMachine holds as `qmp_client`.
import datetime as dt
import socket
from collections.abc import Iterator
from io import TextIOWrapper
from pathlib import Path
from queue import Queue
from typing import Any

class QMPAPIError(RuntimeError):
    class_name: Any
    description: Any
    transaction_id: Any
    def __init__(self, message: dict[str, Any]) -> None: ...

class QMPSession:
    sock: socket.socket
    results: Queue[dict[str, str]]
    pending_events: Queue[dict[str, Any]]
    reader: TextIOWrapper
    writer: TextIOWrapper
    def __init__(self, sock: socket.socket) -> None: ...
    @classmethod
    def from_path(cls, path: Path) -> "QMPSession": ...
    def close(self) -> None: ...
    def _wait_for_new_result(self) -> dict[str, str]: ...
    def read_pending_messages(self) -> None: ...
    def wait_for_event(self, timeout: dt.timedelta = ...) -> dict[str, Any]: ...
    def events(self, timeout: dt.timedelta = ...) -> Iterator[dict[str, Any]]: ...
    def send(self, cmd: str, args: dict[str, str] = {}) -> dict[str, str]: ...
