"""Tool results as Python values: an MCP CallToolResult becomes what the code would expect
(structured content, parsed JSON, text, an Image, a Resource, or a list of them), with the whole
result kept on it as `.mcp_result`; `isError: true` raises McpToolError.
"""

import base64
import json

from . import constants, rpc


class ToolDict(dict):
    """A dict tool result; `.mcp_result` is the whole MCP CallToolResult."""

    mcp_result = None


class ToolList(list):
    """A list tool result; `.mcp_result` is the whole MCP CallToolResult."""

    mcp_result = None


class ToolStr(str):
    """A text tool result; `.mcp_result` is the whole MCP CallToolResult."""

    mcp_result = None


def _image_size(mime, data):
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
            return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    except Exception:
        pass
    return None


class Media:
    """Binary content from a tool (image or audio): `.mime`, `.data` (bytes)."""

    kind = "media"

    def __init__(self, data, mime="application/octet-stream"):
        self.data = bytes(data)
        self.mime = mime
        self.mcp_result = None

    @property
    def mimeType(self):
        return self.mime

    def __bytes__(self):
        return self.data

    def save(self, path):
        """Write the bytes to `path`."""
        with open(path, "wb") as f:
            f.write(self.data)
        return path

    def __repr__(self):
        size = _image_size(self.mime, self.data)
        dims = " %dx%d" % size if size else ""
        return "<%s %s, %d bytes%s>" % (type(self).__name__, self.mime, len(self.data), dims)


class Image(Media):
    """An image from a tool. `display(img)` shows it; `.save(path)` writes it."""

    kind = "image"

    def __init__(self, data, mime="image/png"):
        super().__init__(data, mime)

    def _repr_png_(self):
        return self.data if self.mime == "image/png" else None

    def _repr_jpeg_(self):
        return self.data if self.mime in ("image/jpeg", "image/jpg") else None


class Audio(Media):
    """Audio from a tool: `.mime`, `.data` (bytes)."""

    kind = "audio"


class Resource(dict):
    """An embedded resource or resource link (a dict with attribute access: uri, name,
    mimeType, text, blob, description)."""

    mcp_result = None

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def b64decode(s):
    """Base64 text as bytes; b"" when it is not base64."""
    try:
        return base64.b64decode(s or "")
    except Exception:
        return b""


def _content_item(item):
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "text":
        return item.get("text", "")
    if kind == "image":
        return Image(b64decode(item.get("data")), item.get("mimeType") or "image/png")
    if kind == "audio":
        return Audio(b64decode(item.get("data")), item.get("mimeType") or "audio/wav")
    if kind == "resource":
        res = item.get("resource") if isinstance(item.get("resource"), dict) else {}
        out = Resource(type="resource", uri=res.get("uri"))
        for key in ("name", "title", "mimeType", "text"):
            if key in res:
                out[key] = res[key]
        if "blob" in res:
            out["blob"] = b64decode(res.get("blob"))
        return out
    if kind == "resource_link":
        out = Resource(type="resource_link")
        for key in ("uri", "name", "title", "description", "mimeType", "size"):
            if key in item:
                out[key] = item[key]
        return out
    return item


def _result_text(result):
    parts = []
    for item in result.get("content") or []:
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
    if parts:
        return "\n".join(parts)
    if result.get("structuredContent") is not None:
        return json.dumps(result.get("structuredContent"))[:constants.MESSAGE_CAP]
    return ""


def _attach(value, result):
    if type(value) is dict:
        value = ToolDict(value)
    elif type(value) is list:
        value = ToolList(value)
    elif type(value) is str:
        value = ToolStr(value)
    try:
        if isinstance(value, (ToolDict, ToolList, ToolStr, Media, Resource)):
            value.mcp_result = result
    except Exception:
        pass
    return value


def convert_result(result, tool=None, where=""):
    """The Python value of a CallToolResult (dict); `tool` is the tool's metadata (its
    output_schema), `where` a prefix of the error message."""
    if not isinstance(result, dict):
        return result
    if result.get("isError"):
        text = _result_text(result) or "the tool reported an error"
        raise rpc.McpToolError("%s%s" % (where, text), result)
    structured = result.get("structuredContent")
    if structured is not None:
        out_schema = (tool or {}).get("output_schema") or {}
        if (
            isinstance(out_schema, dict)
            and out_schema.get("x-fastmcp-wrap-result")
            and isinstance(structured, dict)
            and list(structured) == ["result"]
        ):
            structured = structured["result"]
        return _attach(structured, result)
    content = result.get("content")
    items = [_content_item(c) for c in content] if isinstance(content, list) else []
    if not items:
        return None
    if all(isinstance(i, str) for i in items):
        if len(items) == 1:
            text = items[0]
            stripped = text.strip()
            if stripped:
                try:
                    return _attach(json.loads(stripped), result)
                except (ValueError, RecursionError):
                    pass
            return _attach(text, result)
        return _attach(list(items), result)
    if len(items) == 1:
        return _attach(items[0], result)
    return _attach(list(items), result)
