"""Turning the body of a ``%%distributed`` cell into a function for the ranks.

The body becomes the body of a function whose value is the cell's last expression. Only the
notebook names the body reads are captured (a symbol-table walk over the compiled function, so
Python's own scoping rules decide what is free), copied at call time.

The cell travels by value as its source text plus those names, and is compiled again on the rank
under the cell's own file name: cloudpickle would otherwise rename a notebook function's code
to ``<dynamic-code>``, and the rank's traceback could neither name nor quote the cell's lines.
"""

from __future__ import annotations

import ast
import re
import symtable
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from serverless_gpu.common import sources

_MAGIC_FILE = re.compile(r"^<%%distributed (In\[\d+\])>$")


class EmptyCellError(ValueError):
    """The cell holds no statement (only comments or blank lines)."""


class CellFunction:
    """A cell body as a zero-argument callable; it unpickles into a plain function."""

    def __init__(
        self,
        body: str,
        *,
        name: str,
        filename: str,
        first_line: int,
        cell_text: str,
        namespace: dict[str, Any],
        has_value: bool,
    ) -> None:
        self.__name__ = self.__qualname__ = name
        self.has_value = has_value
        """Whether the body ends with an expression or returns a value (worth displaying)."""
        self.namespace = namespace
        self._args = (body, filename, name, first_line, cell_text, namespace)

    @property
    def shipped(self) -> tuple[str, ...]:
        """The notebook names the body reads, in sorted order."""
        return tuple(sorted(self.namespace))

    def __call__(self) -> Any:
        return compile_cell(*self._args)()

    def __reduce__(self) -> tuple[Any, ...]:
        return (compile_cell, self._args)


def compile_cell(
    body: str,
    filename: str,
    name: str,
    first_line: int,
    cell_text: str,
    namespace: dict[str, Any],
) -> Callable[[], Any]:
    """The cell as a plain function; runs in the caller (checks) and on every rank."""
    # The cell's lines for linecache, and IPython's name for it ("Cell In[8]"), which the
    # rank's tracebacks then use in its output and log.
    sources.install({filename: (_label(filename), cell_text.splitlines(True))})
    # A fresh namespace named __main__, holding only the names the cell reads.
    module_globals: dict[str, Any] = {"__name__": "__main__", **namespace}
    module = _function_module(_parse(body, filename, first_line), name)
    code = compile(module, filename, "exec")
    exec(code, module_globals)
    function: Callable[[], Any] = module_globals[name]
    return function


def _label(filename: str) -> str | None:
    magic = _MAGIC_FILE.match(filename)
    return f"Cell {magic.group(1)}" if magic else None


def build_cell_function(
    body: str,
    namespace: Mapping[str, Any],
    *,
    name: str,
    filename: str,
    first_line: int = 1,
    cell_text: str | None = None,
) -> CellFunction:
    """Capture what the cell reads, before any launch.

    ``first_line`` is the line of the cell the body starts on, so tracebacks and syntax errors
    point at the line the user sees; ``cell_text`` (default: the body) is what they quote.
    Raises ``SyntaxError`` for a body that does not parse and :class:`EmptyCellError` for one
    without a statement. A top-level ``return value`` ends the body with that value, as the
    last expression does.
    """
    statements = _parse(body, filename, first_line)
    if not statements:
        raise EmptyCellError("the cell has no code to run on the ranks")
    module = _function_module(statements, name)
    compile(module, filename, "exec")  # errors such as 'yield' in the body show up now
    read = global_reads(ast.unparse(module), filename)
    captured = {n: namespace[n] for n in sorted(read) if n in namespace}
    return CellFunction(
        body,
        name=name,
        filename=filename,
        first_line=first_line,
        cell_text=cell_text if cell_text is not None else "\n" * (first_line - 1) + body,
        namespace=captured,
        has_value=isinstance(statements[-1], ast.Expr) or _returns_value(statements),
    )


def global_reads(source: str, filename: str = "<cell>") -> set[str]:
    """Names that code in ``source`` reads from the module namespace (any nesting depth)."""
    return set(_global_reads(symtable.symtable(source, filename, "exec")))


def _global_reads(table: symtable.SymbolTable) -> Iterator[str]:
    for child in table.get_children():
        for symbol in child.get_symbols():
            if symbol.is_global() and symbol.is_referenced():
                yield symbol.get_name()
        yield from _global_reads(child)


def _parse(body: str, filename: str, first_line: int) -> list[ast.stmt]:
    # Parsed where it stands in the cell, so that a SyntaxError names the cell's own line.
    return ast.parse("\n" * (first_line - 1) + body, filename=filename).body


def _function_module(statements: list[ast.stmt], name: str) -> ast.Module:
    module = ast.parse(f"def {name}():\n    pass\n")
    func_def = module.body[0]
    assert isinstance(func_def, ast.FunctionDef)
    func_def.body = _returning_last_expression(statements)
    return module


def _returns_value(statements: list[ast.stmt]) -> bool:
    """Whether the body itself (not a function or class defined in it) has ``return value``."""
    pending: list[ast.AST] = list(statements)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return False


def _returning_last_expression(statements: list[ast.stmt]) -> list[ast.stmt]:
    if isinstance(statements[-1], ast.Expr):
        last = statements[-1]
        return [*statements[:-1], ast.copy_location(ast.Return(value=last.value), last)]
    return statements
