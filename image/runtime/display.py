"""How values are shown: `display()` (images as `display` frames, anything else as text), the
repr of a cell's last value and of displayed text (capped, pandas objects within 60 rows and
20 columns), text capped in its middle, and matplotlib's `plt.show()` made to display.

An image is sent as it is (PNG, JPEG, GIF, WebP, sniffed from its bytes) up to the host's
MAX_IMAGE_BYTES; a larger one becomes a text note, since the host would refuse it.
"""

import base64
import collections
import io
import reprlib
import sys
import threading

from . import channel, constants, output, state, values

_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _sniff(data):
    for magic, mime in _IMAGE_MAGIC:
        if data[: len(magic)] == magic:
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _rich(obj):
    """(mime, bytes) for something that renders as an image, else None."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        mime = _sniff(data)
        return (mime, data) if mime else None
    if isinstance(obj, values.Image):
        return obj.mime, obj.data
    mod = type(obj).__module__ or ""
    if mod.startswith("PIL.") and hasattr(obj, "save"):
        buf = io.BytesIO()
        img = obj
        if getattr(img, "mode", "RGB") not in ("RGB", "RGBA", "L", "LA", "P", "1", "I", "I;16"):
            img = img.convert("RGBA")
        img.save(buf, format="PNG")
        return "image/png", buf.getvalue()
    if mod.startswith("matplotlib"):
        fig = obj if hasattr(obj, "savefig") else getattr(obj, "figure", None)
        if fig is not None and hasattr(fig, "savefig"):
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            return "image/png", buf.getvalue()
    for attr, mime in (("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg")):
        try:
            method = getattr(obj, attr, None)
        except Exception:
            method = None
        if not callable(method):
            continue
        data = method()
        if isinstance(data, tuple) and data:
            data = data[0]
        if isinstance(data, str):
            data = values.b64decode(data)
        if isinstance(data, (bytes, bytearray)) and data:
            return mime, bytes(data)
    return None


def auto_display(value):
    """Whether the last expression's value is also shown as an image."""
    if isinstance(value, values.Image):
        return True
    mod = type(value).__module__ or ""
    return (mod.startswith("PIL.") and hasattr(value, "save")) or (
        mod.startswith("matplotlib") and hasattr(value, "savefig")
    )


def display(*objs):
    """Show objects to the user: images (PNG/JPEG bytes, PIL images, matplotlib figures,
    objects with _repr_png_) as images, anything else as text."""
    for obj in objs:
        ex = state.running
        if ex is None:
            return None
        try:
            rich = _rich(obj)
        except Exception as e:
            print("display(): could not render %s: %s" % (type(obj).__name__, e), file=sys.stderr)
            rich = None
        if rich is not None:
            mime, data = rich
            cap = constants.MAX_IMAGE_BYTES
            if len(data) > cap:
                frame = {"type": "display", "id": ex.id, "mime": "text/plain",
                         "data": "[image %s of %d bytes not shown: larger than %d bytes]" % (mime, len(data), cap)}
            else:
                frame = {"type": "display", "id": ex.id, "mime": mime,
                         "data": base64.b64encode(data).decode("ascii")}
        else:
            cap = constants.TEXT_DISPLAY_CAP
            text = obj if isinstance(obj, str) else repr_value(obj, cap)
            if len(text) > cap:
                text = text[:cap] + "\u2026 [%d more characters]" % (len(text) - cap)
            frame = {"type": "display", "id": ex.id, "mime": "text/plain", "data": text}
        output.flush_std()
        if threading.get_ident() == state.main_ident:
            output.drain()  # what was printed before display() arrives before it
        channel.send(frame)
    return None


def patch_pyplot(plt):
    """matplotlib.pyplot.show displays every open figure and closes them."""
    show = getattr(plt, "show", None)
    if show is None or getattr(show, "_mcp_bridge", False):
        return

    def show(*args, **kwargs):
        """Display every open figure (as PNG) and close them (mcp-code-bridge)."""
        for num in list(plt.get_fignums()):
            try:
                display(plt.figure(num))
            except Exception as e:
                print("plt.show(): could not render figure %s: %s" % (num, e), file=sys.stderr)
        plt.close("all")

    show._mcp_bridge = True
    plt.show = show


# -------------------------------------------------------------------------------- as text

_big_repr = reprlib.Repr()
for _attr, _val in (("maxlevel", 8), ("maxtuple", 200), ("maxlist", 200), ("maxarray", 200),
                    ("maxdict", 100), ("maxset", 100), ("maxfrozenset", 100), ("maxdeque", 100),
                    ("maxstring", constants.VALUE_CAP), ("maxlong", 2000), ("maxother", 2000)):
    setattr(_big_repr, _attr, _val)


def repr_value(value, cap=None):
    """repr(value) within `cap` characters (default VALUE_CAP), never raising."""
    if cap is None:
        cap = constants.VALUE_CAP
    try:
        mod = type(value).__module__ or ""
        pd = sys.modules.get("pandas")
        if pd is not None and mod.startswith("pandas") and hasattr(value, "to_string"):
            with pd.option_context("display.max_rows", 60, "display.max_columns", 20,
                                   "display.width", 200, "display.max_colwidth", 100):
                text = repr(value)
            text += _dtypes_line(value, pd)
        elif isinstance(value, (list, tuple, dict, set, frozenset, collections.deque)) and len(value) > 1000:
            text = _big_repr.repr(value)
        elif isinstance(value, (str, bytes, bytearray)) and len(value) > cap:
            text = repr(value[:cap])
        else:
            text = repr(value)
    except Exception as e:
        text = "<repr of %s failed: %s: %s>" % (type(value).__name__, type(e).__name__, e)
    if not isinstance(text, str):
        text = str(text)
    if len(text) > cap:
        text = text[:cap] + "\u2026 [%d more characters]" % (len(text) - cap)
    return text


def _dtypes_line(value, pd):
    """For a DataFrame whose preview leaves rows or columns out: a line of its columns' dtypes
    (the first 40 by name, then a count per dtype of the rest), which the head and tail do not
    show."""
    if not isinstance(value, pd.DataFrame):
        return ""
    rows, cols = value.shape
    if rows <= 60 and cols <= 20:
        return ""
    dtypes = [(str(c), str(t)) for c, t in value.dtypes.items()]
    shown = ", ".join("%s: %s" % (reprlib.repr(c)[1:-1] if len(c) > 30 else c, t)
                      for c, t in dtypes[:40])
    rest = dtypes[40:]
    if rest:
        counts = collections.Counter(t for _, t in rest)
        shown += ", and %d more (%s)" % (len(rest), ", ".join(
            "%s \u00d7%d" % (t, n) for t, n in counts.most_common()))
    return "\ndtypes: " + shown


def cap_middle(text, cap):
    """`text` within about `cap` characters: its start and its end, what is between counted."""
    if len(text) <= cap:
        return text
    half = cap // 2
    return text[:half] + "\n\u2026 [%d characters omitted] \u2026\n" % (len(text) - cap) + text[-half:]
