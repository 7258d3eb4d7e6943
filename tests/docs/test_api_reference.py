"""The API reference (`fedlight.run.api_reference`): pdoc builds it offline from the docstrings, with a page for every
public module, and every public name has a docstring to build it from."""

from __future__ import annotations

from fedlight.run import api_reference


def test_every_public_name_has_a_docstring():
    missing = api_reference.undocumented()
    assert not missing, f"{len(missing)} public names without a docstring: {', '.join(missing[:20])}"


def test_the_reference_builds_offline_with_a_page_per_module(tmp_path):
    """The plugin boundary and the algorithms (every module's page is the same code path; the whole reference
    takes half a minute more, `python -m fedlight.run.api_reference`)."""
    packages = ("fedlight.plugin", "fedlight.algorithms")
    index = api_reference.build(tmp_path, packages)
    assert index.is_file()
    for module in (m for m in api_reference.modules() if m.__name__.startswith(packages)):
        page = tmp_path.joinpath(*module.__name__.split(".")).with_suffix(".html")
        assert page.is_file(), module.__name__
    page = (tmp_path / "fedlight" / "algorithms" / "fedavg.html").read_text()
    assert "sample clients, train locally, average weighted by data size" in page  # the module's docstring
