"""Griffe extension for the API reference: the clients' calls as their users see them.

``Client`` and ``SyncClient`` get their producer and inspection calls from scripts
shared by both (``cyclone.calls``), wrapped by ``twin``: read statically, such a call
returns ``Script[T]``, a few are declared again without a docstring for the type
checker, and ``wait`` takes its docstring from ``WAIT_DOC`` at import time. This
extension shows each call returning ``T``, drops the undocumented re-declarations so
the documented definition is inherited, and gives ``wait`` its docstring. It also turns
the Sphinx roles of the docstrings (``:class:`Run` ``) into code spans for Markdown.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?([^`]+)`")
_SHELLS = ("cyclone.calls.async_shell.AsyncShell", "cyclone.calls.sync_shell.SyncShell")


class ClientCalls(griffe.Extension):
    """Rewrites the calls of ``cyclone.calls`` once the package is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "cyclone":
            return
        wait_doc = _ROLE.sub(r"`\1`", ast.literal_eval(str(pkg["calls.waiting.WAIT_DOC"].value)))
        for path in _SHELLS:
            shell = pkg[path.removeprefix("cyclone.")]
            for name, member in list(shell.members.items()):
                if member.is_function and member.docstring is None and name != "wait":
                    del shell.members[name]
            shell["wait"].docstring = griffe.Docstring(wait_doc, parent=shell["wait"])
        for module in pkg["calls"].modules.values():
            for cls in module.classes.values():
                for func in cls.functions.values():
                    returns = func.returns
                    if isinstance(returns, griffe.ExprSubscript) and str(returns.left) == "Script":
                        func.returns = returns.slice
