# What nixpkgs puts before a VM test's script to type-check it (nixos/lib/testing/driver.nix:
# nixos/lib/test-script-prepend.py, then one `<node>: QemuMachine;` per VM node, `<node>:
# NspawnMachine;` per container node and `vlan<N>: VLan` per VLAN): the driver's globals that the
# script sees (Driver.test_symbols()), with their types. Written from the nixpkgs revision and files
# that test_driver/__init__.pyi names; scripts/check-nixos-scripts.sh writes it, then the hints, then
# the script, and runs mypy on the whole as driver.nix does.

from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Generator, List, Optional, Union
from unittest import TestCase

from test_driver.debug import DebugAbstract, DebugNop
from test_driver.driver import Driver
from test_driver.logger import AbstractLogger, CompositeLogger
from typing_extensions import Protocol

from test_driver.machine import BaseMachine, NspawnMachine, QemuMachine
from test_driver.vlan import VLan


class CreateMachineProtocol(Protocol):
    def __call__(
        self,
        start_command: str | dict,
        *,
        name: Optional[str] = None,
        keep_machine_state: bool = False,
        **kwargs: Any,  # the deprecated keep_vm_state
    ) -> QemuMachine:
        raise Exception("type information only")


class PollingConditionProtocol(Protocol):
    def __call__(
        self,
        fun_: Optional[Callable] = None,
        *,
        seconds_interval: float = 2.0,
        description: Optional[str] = None,
    ) -> Union[Callable[[Callable], ContextManager], ContextManager]:
        raise Exception("type information only")


class AssertionTester(TestCase):
    pass


debug: DebugAbstract = DebugNop()
machines: List[BaseMachine] = []
machines_nspawn: List[NspawnMachine] = []
machines_qemu: List[QemuMachine] = []
t = AssertionTester()
vlans: List[VLan] = []


def _driver() -> Driver:
    raise Exception("type information only")


driver = _driver()
log: AbstractLogger = CompositeLogger([])


def create_machine(
    start_command: str, name: str | None = None, keep_machine_state: bool = False
) -> QemuMachine:
    raise Exception("type information only")


def dump_machine_ssh() -> None:
    return None


def join_all() -> None:
    return None


def polling_condition(
    fun: Callable | None, seconds_interval: float = 0.0, description: str | None = None
):
    pass


def retry(fn: Callable, timeout_seconds: int = 900) -> None:
    pass


def run_tests() -> None:
    return None


def serial_stdout_off() -> None:
    return None


def serial_stdout_on() -> None:
    return None


def start_all() -> None:
    return None


def test_script() -> None:
    return None


@contextmanager
def subtest(str: str) -> Generator[None, None, None]:
    yield
