"""examples/quickstart.ipynb runs from top to bottom in a fresh kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.notebook
def test_quickstart_notebook_runs():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)
    # each cell within a minute (the run cell takes a few seconds on 2 CPUs)
    client = nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    text = "\n".join(
        str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", "")) + str(output.get("data", {}).get("text/html", ""))
        for output in outputs
    )
    assert "client test accuracy (%)" in text  # the summary table of the run cell
    assert "ipywidgets" not in text  # the live progress found its widget
    assert "'mean_accuracy':" in text and "| hdcfl |" in text
