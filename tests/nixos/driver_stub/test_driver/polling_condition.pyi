# test_driver.polling_condition (nixpkgs nixos/lib/test-driver/src/test_driver/
# polling_condition.py): see __init__.pyi.
import datetime as dt
from collections.abc import Callable

from test_driver.logger import AbstractLogger

class PollingConditionError(Exception): ...

class PollingCondition:
    condition: Callable[[], bool]
    interval: dt.timedelta
    description: str | None
    logger: AbstractLogger
    last_called: float
    entry_count: int
    def __init__(
        self,
        condition: Callable[[], bool | None],
        logger: AbstractLogger,
        seconds_interval: float | None = None,
        description: str | None = None,
        *,
        interval: dt.timedelta | None = None,
    ) -> None: ...
    def check(self, force: bool = False) -> bool: ...
    def maybe_raise(self) -> None: ...
    def status_message(self, status: bool) -> str: ...
    @property
    def nested_message(self) -> str: ...
    @property
    def overdue(self) -> bool: ...
    @property
    def entered(self) -> bool: ...
    def __enter__(self) -> None: ...
    def __exit__(self, exc_type: object, exc_value: object, traceback: object) -> None: ...
