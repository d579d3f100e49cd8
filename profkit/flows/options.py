"""What the command line's shared options become for the stages below: --catalog chosen once for
every input (analysis/catalog.choose_catalog) and the summary options built around it; the checks
option callbacks run on --catalog and --peaks while click parses. The command line reaches the
analysis only through here and the other flows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

if TYPE_CHECKING:
    from profkit.analysis.catalog import CatalogChoice
    from profkit.analysis.summarize import SummarizeOptions


def summarize_options(catalog: Optional[str], paths: Iterable[Path | str], **kw: Any) -> tuple[SummarizeOptions, CatalogChoice]:
    """The summary options for `paths` (SummarizeOptions' other fields as keywords) under the catalog
    chosen for them, and that choice (its note says when the run manifest implied it)."""
    from profkit.analysis.catalog import choose_catalog
    from profkit.analysis.summarize import SummarizeOptions

    choice = choose_catalog(catalog, paths)
    return SummarizeOptions(catalog=choice, **kw), choice


def load_catalog(value: str) -> Any:
    """--catalog's value loaded (a name in kernels/ or a .toml path); UsageError when it is neither."""
    from profkit.analysis.catalog import load_catalog as load

    return load(value)


def load_peaks(value: Path) -> Any:
    """--peaks' file read; UsageError when it is not a peaks file."""
    from profkit.analysis.peaks import load_peaks_file

    return load_peaks_file(value)
