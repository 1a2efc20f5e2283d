"""What every generator shares: marked blocks in markdown and reproducible PNGs.

A generated block sits between two HTML comments, each a line of its own
(not indented), e.g.
    <!-- results:begin -->
    ...
    <!-- results:end -->
and only the text between them is replaced; a marker quoted inside a line of
prose, or indented as here, is text. A PNG is written with one fixed
text chunk, Software = "matplotlib X.Y.Z", and no time stamp, so the same CSVs
and the same matplotlib give the same bytes (and the file says which version
drew it).
"""
import io
import re


class BlockError(Exception):
    """A page whose markers are malformed: a begin without its end, or two begins."""


def replace_block(text, begin, end, body, where):
    """`text` with what lies between `begin` and `end` replaced by `body`, or None without markers.

    `body` goes on its own lines: begin, body, end. Raises BlockError when the
    markers are not exactly one begin followed by one end.
    """
    begins = [m.start() for m in re.finditer(f"^{re.escape(begin)}$", text, re.M)]
    ends = [m.start() for m in re.finditer(f"^{re.escape(end)}$", text, re.M)]
    if not begins and not ends:
        return None
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise BlockError(f"{where}: expected one line '{begin}' followed by one line '{end}'")
    return f"{text[:begins[0] + len(begin)]}\n{body}\n{text[ends[0]:]}"


def software():
    """The Software text chunk of every PNG: the matplotlib version that drew it."""
    import matplotlib
    return f"matplotlib {matplotlib.__version__}"


def png_bytes(fig, dpi):
    """The figure as PNG bytes with fixed metadata; closes the figure."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": software()})
    plt.close(fig)
    return buf.getvalue()


def write_if_changed(path, data):
    """Writes `data` (bytes) to `path` unless the file already holds exactly that; True when written."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except OSError:
        pass
    with open(path, "wb") as f:
        f.write(data)
    return True
