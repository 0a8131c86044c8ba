"""The pinned package list of the documentation corpus, each with the generator it represents.

Names are pinned, versions are not: Debian replaces a package's file on its mirrors with each
security update, so the version fetched is the one apt knows now, recorded in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Package:
    name: str
    generator: str
    # Where in the package its documents lie (relative to the package root).
    roots: tuple[str, ...] = ("usr/share/doc",)


PACKAGES: tuple[Package, ...] = (
    Package("git-doc", "AsciiDoc XHTML 1.1 with an XML declaration; AsciiDoc sources as text"),
    Package(
        "debian-reference-en",
        "DocBook XSL XHTML 1.1 with an XML declaration; a dblatex PDF",
        ("usr/share/debian-reference", "usr/share/doc"),
    ),
    Package("debian-faq", "DocBook XSL XHTML 1.0 with an XML declaration"),
    Package("libxml2-doc", "XSLT-generated XHTML with an XML declaration; C examples"),
    Package("sphinx-doc", "Sphinx HTML5; reStructuredText sources as text"),
    Package("debian-policy", "Sphinx HTML; plain-text policy documents"),
    Package("libjsoncpp-doc", "Doxygen 1.9 HTML and SVG"),
    Package("libcommons-io-java-doc", "javadoc HTML"),
    Package("autoconf-doc", "texinfo (makeinfo) HTML in one page; gzipped PDF and PostScript"),
    Package("gnutls-doc", "texinfo HTML; GTK-Doc (DocBook) API reference; a texinfo PDF; C examples"),
    Package("groff", "groff -Thtml (grohtml) and mom HTML; groff PDFs", ("usr/share/doc/groff-base",)),
    Package("bash-doc", "man2html HTML; texinfo PDFs; shell scripts and plain text"),
    Package(
        "librust-clap-dev",
        "Markdown (a crate's README, CHANGELOG and examples); Rust source",
        ("usr/share/cargo/registry",),
    ),
    Package("doc-debian", "plain text (Debian's project documents)"),
)


# Files that are not well-formed on purpose (a parser's test input): PARSE_ERROR is their honest end.
MALFORMED: dict[tuple[str, str], str] = {
    ("libxml2-doc", "usr/share/doc/libxml2/html/examples/tst.xml"): "two root elements",
}
