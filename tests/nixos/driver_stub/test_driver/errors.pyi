# test_driver.errors (nixpkgs nixos/lib/test-driver/src/test_driver/errors.py): see __init__.pyi.

class TestScriptError(Exception):
    """The test script failed; the driver prints only the script's own stack frames."""

class RequestedAssertionFailed(TestScriptError):
    """A check the script asked for failed: `machine.succeed(...)`, `t.assertEqual(...)`."""

class MachineError(Exception):
    """A machine could not do what the script asked (driver.py logs its whole traceback)."""
