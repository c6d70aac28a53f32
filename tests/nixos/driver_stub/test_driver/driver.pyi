# test_driver.driver (nixpkgs nixos/lib/test-driver/src/test_driver/driver.py): the `driver` object
# of a test script; see __init__.pyi for the revision this is written from.
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import TestCase

from test_driver.debug import DebugAbstract
from test_driver.logger import AbstractLogger
from test_driver.machine import NspawnMachine, QemuMachine
from test_driver.polling_condition import PollingCondition
from test_driver.vlan import VLan

class AssertionTester(TestCase):
    """`t` in a test script: unittest's assert* methods, failing as RequestedAssertionFailed."""

def get_tmp_dir() -> Path: ...
def pythonize_name(name: str) -> str: ...

@dataclass
class VsockPair:
    guest: Path
    host: Path
    cid: int

class VHostDeviceVsock:
    sockets: dict[str, VsockPair]
    def __init__(self, tmp_dir: Path, machines: list[str]) -> None: ...

class Driver:
    tests: str
    out_dir: Path
    vlans: list[VLan]
    machines_qemu: list[QemuMachine]
    machines_nspawn: list[NspawnMachine]
    polling_conditions: list[PollingCondition]
    global_timeout: int
    race_timer: threading.Timer
    vm_start_scripts: dict[str, str]
    container_start_scripts: dict[str, str]
    vlan_ids: list[int]
    keep_machine_state: bool
    logger: AbstractLogger
    debug: DebugAbstract
    vhost_vsock: VHostDeviceVsock | None
    enable_ssh_backdoor: bool
    def __init__(
        self,
        vm_names: list[str],
        vm_start_scripts: list[str],
        container_names: list[str],
        container_start_scripts: list[str],
        vlans: list[int],
        tests: str,
        out_dir: Path,
        logger: AbstractLogger,
        keep_machine_state: bool = False,
        global_timeout: int = ...,
        debug: DebugAbstract = ...,
        enable_ssh_backdoor: bool = False,
    ) -> None: ...
    def __enter__(self) -> "Driver": ...
    def __exit__(self, *_: Any) -> None: ...
    def _init_nspawn_environment(self) -> None: ...
    @property
    def machines(self) -> list[QemuMachine | NspawnMachine]: ...
    def subtest(self, name: str) -> Iterator[None]: ...
    def test_symbols(self) -> dict[str, Any]: ...
    def dump_machine_ssh(self) -> None: ...
    def test_script(self) -> None: ...
    def run_tests(self) -> None: ...
    def start_all(self) -> None: ...
    def join_all(self) -> None: ...
    def terminate_test(self) -> None: ...
    def create_machine(
        self,
        start_command: str,
        *,
        name: str | None = None,
        keep_machine_state: bool = False,
    ) -> QemuMachine: ...
    def serial_stdout_on(self) -> None: ...
    def serial_stdout_off(self) -> None: ...
    def check_polling_conditions(self) -> None: ...
    def polling_condition(
        self,
        fun_: Callable[..., Any] | None = None,
        *,
        seconds_interval: float = 2.0,
        description: str | None = None,
    ) -> Callable[[Callable[..., Any]], AbstractContextManager[Any]] | AbstractContextManager[Any]: ...
