"""The cell body as a function: what it captures, what it returns, how it travels."""

from __future__ import annotations

import pickle
import subprocess
import sys
import traceback

import cloudpickle
import pytest

from jupyter_ext.cellfunc import build_cell_function, global_reads


def test_only_the_names_the_cell_reads_are_captured() -> None:
    namespace = {
        "scale": 3,
        "helper": lambda x: x + 1,
        "Base": dict,
        "unused": object(),
        "shadowed": "notebook value",
        "written_only": 1,
    }
    body = (
        "import math\n"
        "shadowed = 2\n"
        "def inner(v):\n"
        "    return helper(v) * scale + shadowed\n"
        "class Thing(Base):\n"
        "    pass\n"
        "global written_only\n"
        "written_only = 5\n"
        "[inner(i) for i in range(2)] + [math.floor(1.5), len(Thing())]\n"
    )
    cell = build_cell_function(body, namespace, name="cell_1", filename="<cell 1>")
    assert cell.shipped == ("Base", "helper", "scale")
    assert cell.has_value
    assert cell() == [(0 + 1) * 3 + 2, (1 + 1) * 3 + 2, 1, 0]


def test_value_of_last_expression_and_cells_without_one() -> None:
    assert build_cell_function("x = 2\nx * 21", {}, name="c", filename="<c>")() == 42
    no_value = build_cell_function("x = 2", {}, name="c", filename="<c>")
    assert not no_value.has_value
    assert no_value() is None


def test_syntax_errors_are_raised_before_anything_runs() -> None:
    with pytest.raises(SyntaxError):
        build_cell_function("x = (", {}, name="c", filename="<c>")


def test_global_reads_follows_python_scoping() -> None:
    source = "def f():\n    a = 1\n    def g():\n        return a + b\n    return [c for _ in d]\n"
    assert global_reads(source) == {"b", "c", "d"}


def test_it_unpickles_into_a_plain_function_quoting_the_cell() -> None:
    text = "%%distributed\nvalue = 1\nraise ValueError(limit)\n"
    cell = build_cell_function(
        "value = 1\nraise ValueError(limit)\n",
        {"limit": 7},
        name="cell_4",
        filename="<%%distributed In[4]>",
        first_line=2,
        cell_text=text,
    )
    function = pickle.loads(cloudpickle.dumps(cell))
    assert function.__name__ == "cell_4"
    with pytest.raises(ValueError, match="7") as info:
        function()
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == (
        "<%%distributed In[4]>",
        3,
        "raise ValueError(limit)",
    )


def test_it_runs_in_a_fresh_interpreter_without_the_notebook() -> None:
    # Notebook-defined helpers travel by value: nothing of this process is needed there.
    namespace: dict[str, object] = {}
    exec("def double(x):\n    return 2 * x\n", {"__name__": "__main__"}, namespace)
    cell = build_cell_function("double(21)", namespace, name="c", filename="<c>")
    payload = cloudpickle.dumps(cell)
    code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read())())"
    out = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, check=True, timeout=60
    )
    assert out.stdout.strip() == b"42"
