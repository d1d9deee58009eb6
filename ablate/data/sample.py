"""Build the shipped sample: English Wikipedia article prose in FineWeb-Edu's schema.

    ablate data build-sample [--wheel gensim-4.4.0-....whl] [--out ablate/data/assets/sample.parquet]

Input: the English Wikipedia test dump inside the `gensim==4.4.0` wheel (revisions of April 2016,
CC BY-SA; see assets/README.md). Without `--wheel` the wheel is fetched with `pip download`. gensim
itself is never imported: the wheel is read as a zip, and the wiki markup is removed by the small
cleaner below (templates, tables, references, files, categories, link syntax, reference sections).

Why Wikipedia rather than Python's reStructuredText documentation: it is encyclopedic English prose
written for readers, close to FineWeb-Edu's educational web text, not reference text full of code.

Only this build script needs pip and the network; reading the sample (`--source sample`) needs neither.
"""

from __future__ import annotations

import bz2
import hashlib
import html
import io
import logging
import re
import subprocess
import sys
import tempfile
import urllib.parse
import xml.etree.ElementTree as ElementTree
import zipfile
from collections.abc import Iterator
from pathlib import Path

from ablate.data.tokenizer import encode

log = logging.getLogger(__name__)

GENSIM = "gensim==4.4.0"
DUMP_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
DUMP_SHA256 = "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d"
DUMP_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302"
OUT = Path(__file__).with_name("assets") / "sample.parquet"
MIN_CHARS = 500  # articles shorter than this after cleaning are stubs or lists: left out

# Sections that hold no prose: everything from the first of these headings on is dropped.
END_SECTIONS = {
    "see also", "references", "notes", "external links", "further reading", "bibliography", "sources",
    "footnotes", "citations", "notes and references", "references and notes", "works cited",
}
# Tags removed with everything inside them (not prose).
DROPPED_ELEMENTS = ("ref", "math", "gallery", "timeline", "imagemap", "score", "syntaxhighlight", "source", "table")
# Link prefixes that are not part of the text (files, categories, other wikis and languages).
NON_TEXT_LINK = re.compile(r"^\s*:?\s*(file|image|media|category|wikipedia|wp|wikt|[a-z]{2,3}(-[a-z]+)?)\s*:", re.I)

_COMMENT = re.compile(r"<!--.*?-->", re.S)
_SELF_CLOSING_REF = re.compile(r"<ref[^>]*/>", re.I)
_ELEMENT = {tag: re.compile(rf"<{tag}\b[^>]*>.*?</{tag}\s*>", re.I | re.S) for tag in DROPPED_ELEMENTS}
_INNER_TEMPLATE = re.compile(r"\{\{(?:(?!\{\{|\}\}).)*\}\}", re.S)
_INNER_TABLE = re.compile(r"\{\|(?:(?!\{\||\|\}).)*\|\}", re.S)
_INNER_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:)?//[^\s\]]+(?:\s+([^\]]*))?\]")
_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)")


def _strip_nested(pattern: re.Pattern, text: str) -> str:
    """Remove innermost matches until none is left (templates and tables nest)."""
    while True:
        text, count = pattern.subn("", text)
        if not count:
            return text


def _link_text(match: re.Match) -> str:
    target, _, label = match.group(1).partition("|")
    if NON_TEXT_LINK.match(target):
        return ""
    return (label.rsplit("|", 1)[-1] if label else target).strip()


def clean_wikitext(text: str) -> str:
    """Article prose from wiki markup: headings become their own paragraphs, markup disappears."""
    text = _COMMENT.sub("", text)
    text = _SELF_CLOSING_REF.sub("", text)
    for pattern in _ELEMENT.values():
        text = pattern.sub("", text)
    text = _strip_nested(_INNER_TEMPLATE, text)
    text = _strip_nested(_INNER_TABLE, text)
    while True:  # innermost links first, so a file caption's links resolve before the file link is dropped
        text, count = _INNER_LINK.subn(_link_text, text)
        if not count:
            break
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", text)
    text = re.sub(r"'{2,}", "", text)
    text = _TAG.sub("", text)
    text = re.sub(r"__[A-Z]+__", "", text)
    text = html.unescape(text).replace("\u00a0", " ")

    paragraphs: list[str] = []
    for line in text.splitlines():
        heading = _HEADING.match(line.strip())
        if heading:
            if heading.group(2).strip().lower() in END_SECTIONS:
                break
            line = heading.group(2)
        line = re.sub(r"^[*#:;]+\s*", "", line.strip())
        line = _EMPTY_BRACKETS.sub("", line)
        line = re.sub(r"\s+([,.;:])", r"\1", re.sub(r"[ \t]+", " ", line)).strip()
        if line and not line.startswith(("{", "|", "!", "[[")):  # table rows, leftover file links
            paragraphs.append(line)
    return "\n\n".join(paragraphs)


def read_dump(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(DUMP_MEMBER)
    actual = hashlib.sha256(data).hexdigest()
    if actual != DUMP_SHA256:
        raise SystemExit(f"{DUMP_MEMBER} in {wheel} has SHA-256 {actual}; expected {DUMP_SHA256}")
    return data


def articles(dump: bytes) -> Iterator[dict]:
    """Main-namespace, non-redirect pages: id, title, revision id, timestamp, wikitext."""
    for _, element in ElementTree.iterparse(io.BytesIO(bz2.decompress(dump))):
        if element.tag.rsplit("}", 1)[-1] != "page":
            continue
        fields = {child.tag.rsplit("}", 1)[-1]: child for child in element.iter()}
        if fields["ns"].text == "0" and "redirect" not in fields:
            yield {
                "page_id": element.find("{*}id").text,
                "title": fields["title"].text,
                "revision": element.find("{*}revision/{*}id").text,
                "timestamp": fields["timestamp"].text,
                "wikitext": fields["text"].text or "",
            }
        element.clear()


def sample_rows(dump: bytes) -> list[dict]:
    rows = []
    for article in articles(dump):
        text = clean_wikitext(article["wikitext"])
        if len(text) < MIN_CHARS:
            continue
        title = urllib.parse.quote(article["title"].replace(" ", "_"))
        rows.append({
            "text": text,
            "id": f"enwiki:{article['page_id']}",
            "dump": DUMP_NAME,
            "url": f"https://en.wikipedia.org/w/index.php?title={title}&oldid={article['revision']}",
            "file_path": f"{GENSIM}:{DUMP_MEMBER}",
            "language": "en",
            "language_score": None,
            "token_count": len(encode(text)),
            "score": None,
            "int_score": None,
        })
    return rows


def write_sample(rows: list[dict], out: Path) -> None:
    """FineWeb-Edu's columns and types; the classifier scores are null (they were never computed here)."""
    import pyarrow as pa  # pyarrow only to write the sample's parquet
    import pyarrow.parquet as pq  # pyarrow only to write the sample's parquet

    schema = pa.schema([
        ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
        ("file_path", pa.string()), ("language", pa.string()), ("language_score", pa.float64()),
        ("token_count", pa.int64()), ("score", pa.float64()), ("int_score", pa.int64()),
    ])
    table = pa.Table.from_pylist(rows, schema=schema)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out, compression="zstd", compression_level=19)


def download_wheel(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", GENSIM, "-d", str(folder)],
        check=True,
    )
    return next(folder.glob("gensim-4.4.0-*.whl"))


def build_sample(wheel: Path | None = None, out: Path = OUT) -> Path:
    """Rebuild the shipped sample from the gensim wheel (`ablate data build-sample`); returns `out`."""
    with tempfile.TemporaryDirectory() as folder:
        rows = sample_rows(read_dump(wheel or download_wheel(Path(folder))))
    write_sample(rows, out)
    log.info(
        "wrote %s: %d articles, %s characters, %s GPT-2 tokens, %s bytes", out, len(rows),
        f"{sum(len(r['text']) for r in rows):,}", f"{sum(r['token_count'] for r in rows):,}",
        f"{out.stat().st_size:,}",
    )
    return out
