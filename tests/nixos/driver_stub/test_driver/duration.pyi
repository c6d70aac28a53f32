# test_driver.duration (nixpkgs nixos/lib/test-driver/src/test_driver/duration.py): see __init__.pyi.
import datetime as dt

# A duration of the public test-driver API: a timedelta, or a bare number of seconds (deprecated).
Duration = dt.timedelta | int | float

def as_timedelta(duration: Duration) -> dt.timedelta: ...
def as_seconds(duration: Duration) -> float: ...
