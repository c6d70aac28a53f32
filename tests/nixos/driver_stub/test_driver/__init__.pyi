# A typed stand-in for `test_driver`, the Python package of nixpkgs' NixOS test driver, as its test
# scripts see it: the modules, classes and signatures that nixos/lib/test-script-prepend.py imports
# and that a `testScript` can call. Only types, no behaviour: mypy reads these .pyi files where, in a
# nixpkgs build of a VM test, it reads the installed driver (nixos/lib/testing/driver.nix runs mypy
# on the prepended script with the driver package on its search path).
#
# Written from NixOS/nixpkgs, nixos/lib/test-driver/src/test_driver/ (driver.py, machine/__init__.py,
# logger.py, vlan.py, debug.py, polling_condition.py, duration.py, errors.py), nixos/lib/testing/
# driver.nix and nixos/lib/test-script-prepend.py, as of the nixpkgs revision flake.lock pins
# (391b592eb44808b3bd0cb80bb71b63a5a118b8bb, nixpkgs-unstable of 2026-08-20) as nearly as they could
# be read: the files were read at these stored commits of NixOS/nixpkgs, the nearest available:
#   machine/__init__.py  019697db058b6738eda0cb2cdcc9f5c014c914cb  (BaseMachine/QemuMachine/NspawnMachine)
#   driver.py            003d58163f469fbeb0d51e4ef8d46af622759627, and the later text with
#                        `machines`, `QemuMachine`, `NspawnMachine` and `dump_machine_ssh()` among
#                        the test symbols (the vhost-vsock SSH backdoor)
#   logger.py            0348869915cdf12bbc04a5ab180a9de587ef69e1
#   vlan.py              011792b4f6fb79668fdbbbfc7e57155bb65b7456
#   debug.py             55d5788ba119d2eebd029c1997baef6db81d9372
#   machine/qmp.py       1fd39e0c4e0b0a90339715b7e41d7681bb23a99b  (timedelta timeouts)
#   duration.py          1c7bfe4994b87d7f6a0f60b42dc9b836b7027481
#   driver.nix           01fbdeef22b76df85ea168fbfe1bfd9e63681b30  (`name: QemuMachine;` type hints)
# and NixOS/nixpkgs#542374 (merged 2026-07, before the pin): every timeout, interval and duration
# of the public API is a `Duration` (`datetime.timedelta`, or a bare int/float of seconds, accepted
# and deprecated). Where the text at the pin could differ from what is written here it is a
# parameter's type widened to `Duration`; names, arities, defaults and return types are as read.
