# test_driver.debug (nixpkgs nixos/lib/test-driver/src/test_driver/debug.py): see __init__.pyi.
from abc import ABC, abstractmethod

from test_driver.logger import AbstractLogger

class DebugAbstract(ABC):
    @abstractmethod
    def breakpoint(self, host: str = "127.0.0.1", port: int = 4444) -> None: ...

class DebugNop(DebugAbstract):
    def __init__(self) -> None: ...
    def breakpoint(self, host: str = "127.0.0.1", port: int = 4444) -> None: ...

class Debug(DebugAbstract):
    breakpoint_on_failure: bool
    logger: AbstractLogger
    attach: str
    def __init__(self, logger: AbstractLogger, attach_command: str) -> None: ...
    def breakpoint(self, host: str = "127.0.0.1", port: int = 4444) -> None: ...
