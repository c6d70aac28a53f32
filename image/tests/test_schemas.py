"""A tool function built from the host's rendering of its schema (crates/upstream/src/schema):
the signature shows each rendered type as written, help() the rendered lines with the Python
names, the object types and the note on what a huge schema left out.

    python3 -m pytest -q image/tests/test_schemas.py
"""

import inspect
import typing

from test_modules import rt  # noqa: F401  (the runtime, booted as the image boots it)

# As the bridge sends it for AgentDojo's share_file plus two parameters of other shapes.
TOOL = {
    "name": "share_file",
    "alias": "share_file",
    "description": "Share a file with a user.",
    "input_schema": {
        "$defs": {"SharingPermission": {"enum": ["r", "rw"], "type": "string"}},
        "type": "object",
        "properties": {
            "file_id": {"type": "string"},
            "permission": {"$ref": "#/$defs/SharingPermission"},
            "notify-by": {"anyOf": [{"$ref": "#/$defs/Channel"}, {"type": "null"}], "default": None},
            "limit": {"type": "integer", "default": 10},
        },
        "required": ["file_id", "permission"],
    },
    "rendering": {
        "params": [
            {"name": "file_id", "annotation": "str", "required": True, "line": "(str, required)"},
            {"name": "limit", "annotation": "int", "required": False, "line": "(int, optional, default 10)"},
            {"name": "notify-by", "annotation": "Channel | None", "required": False,
             "line": "(Channel | None, optional, default None)"},
            {"name": "permission", "annotation": "Literal['r', 'rw']", "required": True,
             "line": "(Literal['r', 'rw'], required): The permission level to grant the user."},
        ],
        "types": ["Channel (dict): Where to notify.", "    kind (Literal['mail', 'chat'], required)"],
        "more": "(Schema shortened: ... The whole schema: runtime.query_tool_docs('workspace', 'share_file', detail=\"full\").)",
    },
}


def test_the_signature_shows_the_rendered_types(rt):  # noqa: F811
    func = rt.proxies.make_tool("workspace", "workspace", TOOL)
    assert str(inspect.signature(func)) == (
        "(file_id: str, permission: Literal['r', 'rw'], *, notify_by: Channel | None = None, limit: int = 10)")
    ann = func.__annotations__
    assert ann["file_id"] is str and ann["limit"] is int
    assert repr(ann["permission"]) == "Literal['r', 'rw']"


def test_help_shows_the_rendered_lines_with_python_names(rt):  # noqa: F811
    doc = rt.proxies.make_tool("workspace", "workspace", TOOL).__doc__
    lines = doc.splitlines()
    assert lines[0] == "Share a file with a user."
    assert "    permission (Literal['r', 'rw'], required): The permission level to grant the user." in lines
    assert "    notify_by (Channel | None, optional, default None) (sent as 'notify-by')" in lines
    i = lines.index("Types:")
    assert lines[i + 1:i + 3] == ["    Channel (dict): Where to notify.", "        kind (Literal['mail', 'chat'], required)"]
    assert "runtime.query_tool_docs('workspace', 'share_file', detail=\"full\")" in doc
    # Without a rendering (metadata made by hand), the old plain types.
    plain = dict(TOOL)
    del plain["rendering"]
    func = rt.proxies.make_tool("workspace", "workspace", plain)
    assert func.__annotations__["permission"] is typing.Any
