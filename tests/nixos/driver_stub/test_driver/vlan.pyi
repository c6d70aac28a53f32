# test_driver.vlan (nixpkgs nixos/lib/test-driver/src/test_driver/vlan.py): see __init__.pyi.
# A test script sees each VLAN as `vlan<N>` (driver.nix declares `vlan<N>: VLan`).
import io
import subprocess
from pathlib import Path

from test_driver.logger import AbstractLogger

class VLan:
    nr: int
    socket_dir: Path
    tap_name: str
    process: subprocess.Popen[str]
    pid: int
    fd: io.TextIOBase
    plug_process: subprocess.Popen[bytes]
    logger: AbstractLogger
    def __init__(self, nr: int, tmp_dir: Path, logger: AbstractLogger) -> None: ...
    def stop(self) -> None: ...
