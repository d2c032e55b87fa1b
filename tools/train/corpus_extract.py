#!/usr/bin/env python3
"""corpus_extract.py - turns installed Debian documentation packages into a text corpus.

Called by tools/train/make_corpus.sh (which installs the packages first); standard library only.

    python3 tools/train/corpus_extract.py OUTDIR [--heldout-frac 0.02] [--min-heldout 1200000]

Writes OUTDIR/train.txt, OUTDIR/heldout.txt (documents joined by a line "<|endoftext|>"),
OUTDIR/SOURCES.tsv (package, version, licence, bytes, docs, heldout_bytes, what) and
OUTDIR/docs.tsv (one line per document: split, package, path, bytes).

A document is one file (HTML page, POD page, help file, source file, fortune file); very long
files (the Bible, dictionaries) are cut at paragraph breaks into documents of about 64 KB. The
held-out split takes whole documents: those whose SHA-1 of "package:path:part" is smallest,
until it holds max(min_heldout, heldout_frac * total) bytes. Deterministic: the same packages
give byte-identical files.

Text extraction: HTML through html.parser (navigation, sidebars, scripts, styles, headers and
footers skipped; <pre> kept verbatim), POD through pod2text, dictd databases (.dict.dz are
gzip files) as their text minus the 00-database-* entries, fortune files split at "%" lines.
Normalisation: UTF-8 (files that do not decode are dropped), NFC, no control characters but
tab/newline, trailing spaces removed, at most one blank line in a row, prose runs of spaces
collapsed; lines shorter than 120 bytes that occur more than 30 times within one package
(navigation, copyright footers) are dropped; exact duplicate documents are dropped;
documents under 200 bytes are dropped; the string "<|endoftext|>" never occurs inside a document.
"""
import argparse
import collections
import glob
import gzip
import hashlib
import html.parser
import os
import random
import re
import subprocess
import sys
import unicodedata

SEP = "<|endoftext|>"
MB = 1000 * 1000

# package, kind, globs (relative to /), cap in bytes (0: none), licence (from the package's
# /usr/share/doc/PKG/copyright, checked by hand), what it is
SOURCES = [
    ("sqlite3-doc", "html", ["usr/share/doc/sqlite3/**/*.html"], 0,
     "public-domain", "SQLite documentation"),
    ("bible-kjv-text", "bible", ["usr/lib/bible.data"], 0,
     "public-domain (KJV text, 1611); data tools: free use", "King James Bible (through bible-kjv)"),
    ("dict-devil", "dict", ["usr/share/dictd/devil.dict.dz"], 0,
     "public-domain", "The Devil's Dictionary (Ambrose Bierce)"),
    ("dict-jargon", "dict", ["usr/share/dictd/jargon.dict.dz"], 0,
     "public-domain", "The Jargon File"),
    ("docutils-doc", "text", ["usr/share/doc/docutils-doc/docs/**/*.txt",
                              "usr/share/doc/docutils-doc/docs/**/*.rst"], 0,
     "public-domain / BSD-2-clause", "Docutils documentation"),
    ("fortunes-min", "fortune", ["usr/share/games/fortunes/*"], 0,
     "BSD-3-clause", "fortune cookies (small set)"),
    ("fortunes", "fortune", ["usr/share/games/fortunes/*"], 0,
     "BSD-3-clause (collection); quotations", "fortune cookies"),
    ("python3.11-doc", "html", ["usr/share/doc/python3.11/html/**/*.html"], 0,
     "PSF-2.0", "Python 3.11 documentation"),
    ("postgresql-doc-15", "html", ["usr/share/doc/postgresql-doc-15/html/*.html"], 0,
     "PostgreSQL (BSD-like)", "PostgreSQL 15 manual"),
    ("python-django-doc", "html", ["usr/share/doc/python-django-doc/html/**/*.html"], 0,
     "BSD-3-clause", "Django documentation"),
    ("sphinx-doc", "html", ["usr/share/doc/sphinx-doc/html/**/*.html"], 0,
     "BSD-2-clause", "Sphinx documentation"),
    ("rust-doc", "html", ["usr/share/doc/rust-doc/html/book/**/*.html",
                          "usr/share/doc/rust-doc/html/reference/**/*.html",
                          "usr/share/doc/rust-doc/html/nomicon/**/*.html",
                          "usr/share/doc/rust-doc/html/rust-by-example/**/*.html",
                          "usr/share/doc/rust-doc/html/edition-guide/**/*.html",
                          "usr/share/doc/rust-doc/html/rustc/**/*.html",
                          "usr/share/doc/rust-doc/html/cargo/**/*.html",
                          "usr/share/doc/rust-doc/html/std/**/*.html"], 20 * MB,
     "MIT or Apache-2.0", "Rust books, reference and std documentation"),
    ("erlang-doc", "html", ["usr/share/doc/erlang-doc/**/*.html"], 15 * MB,
     "Apache-2.0", "Erlang/OTP documentation"),
    ("tcl8.6-doc", "roff", ["usr/share/man/man3/*.3tcl.gz"], 0,
     "TCL (BSD-like)", "Tcl 8.6 manual pages"),
    ("perl-doc", "pod", ["usr/share/perl/*/pod/*.pod"], 0,
     "GPL-1+ or Artistic", "Perl documentation"),
    ("vim-runtime", "text", ["usr/share/vim/vim90/doc/*.txt"], 0,
     "Vim (GPL-compatible); OPL-1+ parts", "Vim help files"),
    ("git-doc", "text", ["usr/share/doc/git-doc/**/*.txt"], 0,
     "GPL-2", "Git documentation"),
    ("debian-policy", "html", ["usr/share/doc/debian-policy/policy.html/*.html"], 0,
     "GPL-2+ (and others)", "Debian Policy Manual"),
    ("developers-reference", "html", ["usr/share/developers-reference/*.html"], 0,
     "MIT", "Debian Developer's Reference"),
    ("maint-guide", "html", ["usr/share/doc/maint-guide/html/*.en.html"], 0,
     "GPL-2+ or MIT", "Debian New Maintainers' Guide"),
    ("debian-reference-en", "html", ["usr/share/debian-reference/*.en.html"], 0,
     "GPL-2+", "Debian Reference"),
    ("debian-handbook", "html", ["usr/share/doc/debian-handbook/html/en-US/*.html"], 0,
     "GPL-2+ or CC-BY-SA-3.0", "The Debian Administrator's Handbook"),
    ("dict-gcide", "dict", ["usr/share/dictd/gcide.dict.dz"], 25 * MB,
     "GPL-2+ (Webster 1913 part: public domain)", "GNU Collaborative International Dictionary of English"),
    ("libpython3.11-stdlib", "code", ["usr/lib/python3.11/**/*.py"], 10 * MB,
     "PSF-2.0", "Python standard library source (code)"),
    ("golang-1.19-src", "code", ["usr/share/go-1.19/src/**/*.go"], 10 * MB,
     "BSD-3-clause", "Go standard library source (code)"),
]

# packages whose text is under a copyleft licence only (no permissive alternative among the
# package's terms: maint-guide is "GPL-2+ or MIT" and is taken as MIT); --licences permissive,
# the default, leaves them out, so that the weights trained on the corpus owe nothing to copyleft
COPYLEFT = {"perl-doc", "vim-runtime", "git-doc", "debian-policy", "debian-reference-en",
            "debian-handbook", "dict-gcide"}

SKIP_TAGS = {"script", "style", "head", "nav", "noscript", "svg", "button", "form", "select",
             "header", "footer", "template", "iframe", "math"}
SKIP_ATTR = re.compile(r"(sidebar|navheader|navfooter|related|footer|leftnav|breadcrumb|"
                       r"menu-bar|headerlink|sphinxsidebar|navigation|nav-chapters|"
                       r"mobile-nav|toc|srclink|out-of-band|rightside|sub-heading|"
                       r"searchbox|search-form|copyright)", re.I)
BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5",
              "h6", "table", "tr", "blockquote", "section", "article", "hr", "pre", "title",
              "caption", "figure", "figcaption", "main", "aside", "summary", "details"}
VOID_TAGS = {"br", "img", "hr", "meta", "link", "input", "area", "base", "col", "embed",
             "param", "source", "track", "wbr"}


class HtmlText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip_tag = None
        self.skip_depth = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth += 1
            return
        a = dict(attrs)
        attr = " ".join(str(a.get(k) or "") for k in ("class", "id", "role"))
        if tag in SKIP_TAGS or (attr.strip() and SKIP_ATTR.search(attr)):
            if tag not in VOID_TAGS:
                self.skip_tag, self.skip_depth = tag, 1
            return
        if tag == "pre":
            self.pre += 1
            self.out.append("\n\n")
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6", "p", "blockquote", "table", "dl", "ul", "ol"):
            self.out.append("\n\n")
        elif tag in BLOCK_TAGS:
            self.out.append("\n")
        elif tag in ("td", "th"):
            self.out.append(" ")
        if tag == "li":
            self.out.append("- ")

    def handle_startendtag(self, tag, attrs):
        if self.skip_tag is None and tag in BLOCK_TAGS:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth -= 1
                if self.skip_depth == 0:
                    self.skip_tag = None
            return
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
            self.out.append("\n\n")
        elif tag in BLOCK_TAGS:
            self.out.append("\n")

    def handle_data(self, data):
        if self.skip_tag is not None:
            return
        if self.pre:
            self.out.append(data.replace("\n", "\x00"))  # protected newline
        else:
            self.out.append(re.sub(r"\s+", " ", data))

    def text(self):
        t = "".join(self.out)
        lines = [ln.strip() for ln in t.split("\n")]
        t = "\n".join(lines).replace("\x00", "\n")
        return t


def html_to_text(raw):
    p = HtmlText()
    try:
        p.feed(raw)
        p.close()
    except Exception:
        return ""
    return p.text()


CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")


def normalise(text, code=False):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n")
    text = unicodedata.normalize("NFC", text)
    text = CTRL.sub("", text)
    text = text.replace(SEP, "<| endoftext |>")
    lines = []
    for ln in text.split("\n"):
        ln = ln.rstrip()
        if not code:
            ln = ln.replace("\t", "    ")
            m = re.match(r" *", ln)
            ind = m.group(0)
            ln = ind + re.sub(r" {2,}", " ", ln[len(ind):])
        lines.append(ln)
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz") or path.endswith(".dz"):
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def chunks(text, size=64000):
    """Cut a long text at blank lines into parts of about size bytes."""
    parts, cur, n = [], [], 0
    for para in text.split("\n\n"):
        cur.append(para)
        n += len(para.encode()) + 2
        if n >= size:
            parts.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        parts.append("\n\n".join(cur))
    return parts


def extract(kind, path):
    """Returns a list of (part_name, text) documents of one file."""
    if kind == "html":
        raw = read_text(path)
        if raw is None:
            with open(path, "rb") as f:
                raw = f.read().decode("latin-1")
        return [("", html_to_text(raw))]
    if kind in ("text", "code"):
        t = read_text(path)
        return [] if t is None else [("", t)]
    if kind == "pod":
        r = subprocess.run(["pod2text", "-w", "100", path], capture_output=True)
        if r.returncode != 0:
            return []
        try:
            return [("", r.stdout.decode("utf-8"))]
        except UnicodeDecodeError:
            return [("", r.stdout.decode("latin-1"))]
    if kind == "roff":
        env = dict(os.environ, MANWIDTH="100", GROFF_NO_SGR="1")
        r = subprocess.run("zcat '%s' | groff -man -rHY=0 -rLL=100n -Tutf8 -P-c -P-b -P-u 2>/dev/null" % path,
                           shell=True, capture_output=True, env=env)
        t = r.stdout.decode("utf-8", "replace")
        t = re.sub(r".\x08", "", t)
        return [("", t)]
    if kind == "bible":
        # the bible-kjv program prints the text of its compressed data file
        r = subprocess.run(["bible", "-l10000", "Gen1:1-Rev22:21"], capture_output=True,
                           stdin=subprocess.DEVNULL)
        t = r.stdout.decode("utf-8", "replace")
        t = re.sub(r"^ +\d+ ", "", t, flags=re.M)  # verse numbers
        parts = re.split(r"\n(?=\S[^\n]* 1\n)", t)  # one part per book (chapter 1 starts it)
        return [(str(i), c) for i, c in enumerate(parts)]
    if kind == "dict":
        with open(path, "rb") as f:
            data = gzip.decompress(f.read())
        # gcide has a few cp1252 bytes among its UTF-8: those characters are dropped
        t = data.decode("utf-8", "replace").replace("\ufffd", "")
        # drop the 00-database-* header entries (database metadata, not text)
        t = re.sub(r"^00-?database-\S*\n(.*\n)*?(?=\S)", "", t, flags=re.M)
        return [(str(i), c) for i, c in enumerate(chunks(t))]
    if kind == "fortune":
        t = read_text(path)
        if t is None:
            return []
        cookies = [c.strip("\n") for c in re.split(r"^%\s*$", t, flags=re.M)]
        return [("", "\n\n".join(c for c in cookies if c.strip()))]
    raise ValueError(kind)


def pkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def files_of(pkg, globs):
    """Files matching the globs, restricted to files the package owns (dpkg -L)."""
    r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
    owned = set(r.stdout.split("\n")) if r.returncode == 0 else set()
    out = set()
    for g in globs:
        for f in glob.glob("/" + g, recursive=True):
            if os.path.isfile(f) and not os.path.islink(f) and f in owned:
                out.add(f)
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--heldout-frac", type=float, default=0.02)
    ap.add_argument("--min-heldout", type=int, default=1200000)
    ap.add_argument("--only", default="", help="comma-separated packages (testing)")
    ap.add_argument("--licences", choices=["permissive", "all"], default="permissive",
                    help="permissive: public-domain and permissive texts only (the default); "
                         "all: the copyleft packages too (COPYLEFT)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    only = set(filter(None, args.only.split(",")))

    docs = []  # (key, pkg, path, text)
    seen = set()
    meta = []
    for pkg, kind, globs, cap, lic, what in SOURCES:
        if (only and pkg not in only) or (args.licences == "permissive" and pkg in COPYLEFT):
            continue
        ver = pkg_version(pkg)
        if not ver:
            print("corpus: %s not installed, skipped" % pkg, file=sys.stderr)
            continue
        files = files_of(pkg, globs)
        if kind == "fortune":
            files = [f for f in files if not f.endswith((".dat", ".u8")) and "/off/" not in f
                     and not f.endswith("ascii-art")]
        if kind == "html":
            files = [f for f in files if not re.search(r"/(_modules|_sources|genindex|search)", f)]
        if kind == "code":
            files = [f for f in files if not re.search(r"/(test|tests|testdata|idlelib|vendor)/|_test\.go$", f)]
            random.Random(pkg).shuffle(files)  # a cap takes a spread, not one folder
        pdocs = []
        total = 0
        for f in files:
            for part, raw in extract(kind, f):
                t = normalise(raw, code=(kind == "code"))
                n = len(t.encode())
                if n < 200:
                    continue
                pdocs.append([f + (":" + part if part else ""), t])
                total += n
            if cap and total > cap * 1.3:  # room for the boilerplate filter below
                break
        # lines that repeat within a package (navigation, footers) are boilerplate
        cnt = collections.Counter()
        for _, t in pdocs:
            cnt.update(set(t.split("\n")))
        bad = {ln for ln, c in cnt.items() if c > 30 and 0 < len(ln.encode()) < 120
               and kind not in ("code", "bible", "dict")}
        bad.discard("")
        nbytes = ndocs = 0
        for path, t in pdocs:
            if bad:
                t = "\n".join(ln for ln in t.split("\n") if ln not in bad)
                t = re.sub(r"\n{3,}", "\n\n", t).strip("\n")
            n = len(t.encode())
            h = hashlib.sha1(t.encode()).digest()
            if n < 200 or h in seen:
                continue
            if cap and nbytes + n > cap:
                continue
            seen.add(h)
            key = hashlib.sha1(("%s:%s" % (pkg, path)).encode()).hexdigest()
            docs.append((key, pkg, path, t))
            nbytes += n
            ndocs += 1
        meta.append([pkg, ver, lic, nbytes, ndocs, what])
        print("corpus: %-22s %-28s %9d bytes %6d docs (%d files, %d boilerplate lines)"
              % (pkg, ver, nbytes, ndocs, len(files), len(bad)), file=sys.stderr)

    total = sum(len(d[3].encode()) for d in docs)
    want = max(args.min_heldout, int(args.heldout_frac * total))
    held = set()
    hb = 0
    for d in sorted(docs, key=lambda d: d[0]):
        if hb >= want:
            break
        n = len(d[3].encode())
        if n > 200000:  # keep any single huge document out of the held-out choice
            continue
        held.add(d[0])
        hb += n
    order = sorted(docs, key=lambda d: hashlib.sha1(("order:" + d[0]).encode()).digest())
    hbytes = collections.Counter()
    with open(os.path.join(args.outdir, "train.txt"), "w", encoding="utf-8") as tr, \
         open(os.path.join(args.outdir, "heldout.txt"), "w", encoding="utf-8") as he, \
         open(os.path.join(args.outdir, "docs.tsv"), "w", encoding="utf-8") as dt:
        dt.write("split\tpackage\tpath\tbytes\n")
        for key, pkg, path, t in order:
            split = "heldout" if key in held else "train"
            (he if split == "heldout" else tr).write(t + "\n" + SEP + "\n")
            n = len(t.encode())
            if split == "heldout":
                hbytes[pkg] += n
            dt.write("%s\t%s\t%s\t%d\n" % (split, pkg, path, n))
    with open(os.path.join(args.outdir, "SOURCES.tsv"), "w", encoding="utf-8") as s:
        s.write("package\tversion\tlicence\tbytes\tdocs\theldout_bytes\twhat\n")
        for pkg, ver, lic, nb, nd, what in meta:
            s.write("%s\t%s\t%s\t%d\t%d\t%d\t%s\n" % (pkg, ver, lic, nb, nd, hbytes[pkg], what))
    print("corpus: %d documents, %d bytes; held-out %d documents, %d bytes"
          % (len(docs), total, len(held), hb), file=sys.stderr)


if __name__ == "__main__":
    main()
