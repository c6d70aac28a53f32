"""Tests of packages on demand inside the sandbox: image/runtime/installs.py (what the `ready`
frame says of this interpreter, `runtime.install` and `runtime.installed`) and the error kinds of
an install's answer in image/runtime/rpc.py. The modules run in this process, installed by the
real loader as in test_modules.py (its `rt` fixture); the host is a stand-in for
`channel.send_bytes` that records each request and answers it.
"""

import asyncio
import json
import os
import platform
import sys

import pytest

from test_modules import rt  # noqa: F401 (the fixture: the runtime's package, loaded once)


# ------------------------------------------------------------------------- the image's dists


def test_dist_of_reads_dist_info_and_egg_info_names(rt):
    dist_of = rt.installs._dist_of
    assert dist_of("numpy-2.4.6.dist-info") == ("numpy", "2.4.6")
    assert dist_of("foo-1.0-py3.14.egg-info") == ("foo", "1.0")
    assert dist_of("scikit_learn-1.8.0.dist-info") == ("scikit_learn", "1.8.0")
    assert dist_of("zope.interface-7.0.dist-info") == ("zope.interface", "7.0")
    for junk in (
        "",
        "numpy",
        "numpy.py",
        "numpy-2.4.6",
        "numpy.dist-info",  # no version
        "-2.4.6.dist-info",  # no name
        "numpy-2.4.6.dist-info.bak",
        "numpy-2.4.6.egg-link",
        "README.txt",
        "__pycache__",
    ):
        assert dist_of(junk) is None, junk


def _site(path, *entries):
    """A directory like site-packages: a metadata directory per entry, and a module file."""
    path.mkdir(parents=True)
    for e in entries:
        (path / e).mkdir()
    (path / "module.py").write_text("")
    return path


def test_dists_are_the_images_own_and_skip_packages_dir(rt, tmp_path, monkeypatch):
    installs = rt.installs
    image = _site(tmp_path / "site", "numpy-2.4.6.dist-info", "pandas-3.0.0.dist-info",
                  "foo-1.0-py3.14.egg-info", "numpy.libs")
    # The same name again further down sys.path: the first one is the one imported, and counted.
    later = _site(tmp_path / "later", "NumPy-1.0.dist-info", "six-1.17.0.dist-info")
    packages = _site(tmp_path / "packages", "tabulate-0.9.0.dist-info")
    (tmp_path / "link").symlink_to(packages)  # the installs' mount under another name
    (tmp_path / "file.zip").write_text("")
    monkeypatch.setattr(installs, "PACKAGES_DIR", str(packages.resolve()))
    monkeypatch.setattr(sys, "path", [
        "", str(image), str(packages), str(tmp_path / "link"), str(tmp_path / "missing"),
        str(tmp_path / "file.zip"), str(later),
    ])
    assert installs.dists() == [("foo", "1.0"), ("numpy", "2.4.6"), ("pandas", "3.0.0"), ("six", "1.17.0")]


def test_dists_are_bounded_by_max_dists(rt, tmp_path, monkeypatch):
    installs = rt.installs
    first = _site(tmp_path / "a", "a1-1.dist-info", "a2-1.dist-info")
    second = _site(tmp_path / "b", *["b%d-1.dist-info" % i for i in range(10)])
    third = _site(tmp_path / "c", "c-1.dist-info")
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(third)])
    monkeypatch.setattr(installs, "MAX_DISTS", 5)
    found = installs.dists()
    assert len(found) == 5 and found == sorted(found)
    names = {n for n, _ in found}
    assert {"a1", "a2"} <= names and "c" not in names
    monkeypatch.setattr(installs, "MAX_DISTS", 4000)
    assert len(installs.dists()) == 13


def test_target_says_what_this_interpreter_is(rt, tmp_path, monkeypatch):
    installs = rt.installs
    monkeypatch.setattr(sys, "path", [str(_site(tmp_path / "site", "numpy-2.4.6.dist-info"))])
    t = installs.target()
    assert sorted(t) == ["dists", "libc", "machine", "python"]
    assert t["python"] == platform.python_version() and t["machine"] == platform.machine()
    assert isinstance(t["libc"], str)
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        assert t["libc"].startswith("glibc "), t["libc"]
    assert t["dists"] == [["numpy", "2.4.6"]]
    assert json.loads(json.dumps(t)) == t  # it goes into the `ready` frame as it is

    def no_confstr(name):
        raise ValueError("unrecognized configuration name")

    monkeypatch.setattr(os, "confstr", no_confstr)
    assert installs.target()["libc"] == ""  # musl, or not Linux: the bridge is told nothing


def test_packages_dir_goes_last_on_sys_path_once(rt, monkeypatch):
    installs = rt.installs
    monkeypatch.setattr(sys, "path", ["/usr/lib/python3/site-packages"])
    installs.add_to_path()
    installs.add_to_path()
    assert sys.path == ["/usr/lib/python3/site-packages", installs.PACKAGES_DIR]


# --------------------------------------------------------------------------- install requests


@pytest.fixture
def host(rt, monkeypatch):
    """The bridge: records each request frame and answers it with `host.answer` (a dict, or a
    function of the frame returning one). A cell is running (exec 7)."""

    class Host:
        sent = []
        answer = {"ok": True, "result": {"installed": []}}

        def send_bytes(self, data):
            frame = json.loads(data)
            self.sent.append(frame)
            answer = self.answer(frame) if callable(self.answer) else self.answer
            rt.channel.pending[frame["id"]].resolve(answer)
            return True

    h = Host()
    h.sent = []
    monkeypatch.setattr(rt.state, "running", rt.interrupts.Exec(7, 100))
    monkeypatch.setattr(rt.channel, "send_bytes", h.send_bytes)
    yield h
    assert not rt.channel.pending


def test_install_refuses_what_is_not_a_requirement_without_asking(rt, host):
    install = rt.installs.install
    for args, message in [
        ((), "needs at least one requirement"),
        (([],), "needs at least one requirement"),
        (((),), "needs at least one requirement"),
        ((1,), "not int"),
        (("tabulate", None), "not NoneType"),
        ((["tabulate", 2.0],), "not float"),
        ((b"tabulate",), "not bytes"),
        ((["tabulate"], "six"), "not list"),  # a list is one argument, alone
        (({"tabulate": "0.9"},), "not dict"),
    ]:
        with pytest.raises(TypeError, match=message):
            asyncio.run(install(*args))
    assert host.sent == []


def test_install_sends_the_requirements_as_one_list(rt, host):
    install = rt.installs.install
    one = {"name": "a", "version": "1.0", "cached": False, "size": 10}
    two = {"name": "b", "version": "2.0", "cached": True, "size": 20}
    host.answer = {"ok": True, "result": {"installed": [one, "junk", None, two]}}
    assert asyncio.run(install(["a", "b"])) == [one, two]
    assert asyncio.run(install("a", "b")) == [one, two]
    assert asyncio.run(install(("a", "b>=1,<3"))) == [one, two]
    assert asyncio.run(install("a")) == [one, two]
    assert [f["params"] for f in host.sent] == [
        {"requirements": ["a", "b"]},
        {"requirements": ["a", "b"]},
        {"requirements": ["a", "b>=1,<3"]},
        {"requirements": ["a"]},
    ]
    assert {(f["type"], f["method"], f["exec"]) for f in host.sent} == {("rpc", "install", 7)}
    assert len({f["id"] for f in host.sent}) == 4
    # An answer without a list is nothing installed, not an error.
    for result in (None, {}, {"installed": None}, {"installed": "x"}):
        host.answer = {"ok": True, "result": result}
        assert asyncio.run(install("a")) == []


def test_installed_asks_the_host(rt, host):
    row = {"name": "tabulate", "version": "0.9.0", "requested": True}
    host.answer = {"ok": True, "result": {"installed": [row, 3]}}
    assert rt.installs.installed() == [row]
    assert host.sent[-1]["method"] == "installed" and host.sent[-1]["params"] == {}
    host.answer = {"ok": True, "result": None}
    assert rt.installs.installed() == []


# ------------------------------------------------------------------------------ refusals


def test_a_refused_install_raises_package_denied_a_permission_error(rt, host):
    installs = rt.installs
    host.answer = {"ok": False, "kind": "package_denied",
                   "error": "tabulate is refused by packages.deny (config.toml)"}
    with pytest.raises(installs.PackageDenied, match="refused by packages.deny") as e:
        asyncio.run(installs.install("tabulate"))
    assert isinstance(e.value, PermissionError) and not isinstance(e.value, rt.rpc.McpError)
    # The same from a blocking request, and with no message from the host.
    host.answer = {"ok": False, "kind": "package_denied"}
    with pytest.raises(installs.PackageDenied, match="the install was refused"):
        rt.rpc.request_sync("install", {"requirements": ["tabulate"]})


def test_a_failed_install_raises_package_error_an_mcp_error(rt, host):
    installs = rt.installs
    host.answer = {"ok": False, "kind": "package",
                   "error": "no wheel of nosuchthing for CPython 3.14 on x86_64"}
    with pytest.raises(installs.PackageError, match="no wheel of nosuchthing") as e:
        asyncio.run(installs.install("nosuchthing"))
    assert isinstance(e.value, rt.rpc.McpError) and isinstance(e.value, RuntimeError)
    assert not isinstance(e.value, PermissionError)
    # Other refusals keep their own kinds.
    host.answer = {"ok": False, "kind": "denied", "error": "no"}
    with pytest.raises(rt.rpc.ToolDenied):
        asyncio.run(installs.install("x"))
    host.answer = {"ok": False, "error": "the bridge is shutting down"}
    with pytest.raises(rt.rpc.McpError, match="shutting down") as e:
        asyncio.run(installs.install("x"))
    assert type(e.value) is rt.rpc.McpError


def test_the_errors_are_one_class_each_wherever_named(rt):
    assert rt.installs.PackageError is rt.rpc.PackageError
    assert rt.installs.PackageDenied is rt.rpc.PackageDenied
    assert rt.api.PackageError is rt.rpc.PackageError and rt.api.PackageDenied is rt.rpc.PackageDenied
    assert rt.api.install is rt.installs.install and rt.api.installed is rt.installs.installed
    assert {"install", "installed", "PackageError", "PackageDenied"} <= set(rt.api.NAMES)
