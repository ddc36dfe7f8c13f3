"""`differentiate(module)`: every gradient declaration becomes a plain function of the same name."""

from __future__ import annotations

from ..errors import VerifyError
from ..ir import Function, GradDecl, Module, verify
from ..ir.verifier import seed_names
from .inline import MAX_FLAT_STATEMENTS, flat_size, flatten
from .reverse import adjoint


def differentiate(module: Module) -> Module:
    """A module in which every `grad`/`value_and_grad`/`vjp` declaration is a plain function.

    Declarations may refer to declarations (a `vjp` of a `grad` gives Hessian-vector products)
    and functions may call them: items are expanded callees first. Functions without
    declarations come back unchanged. Raises VerifyError for gradients that cannot exist.
    """
    verify(module)
    if not module.grad_decls:
        return module
    done: dict[str, Function] = {}
    for item in _dependency_order(module):
        done[item.name] = expand_decl(item, done) if isinstance(item, GradDecl) else item
    return verify(module.replace([done[it.name] for it in module.items]))


def expand_decl(decl: GradDecl, functions: dict[str, Function]) -> Function:
    """The function a declaration stands for; `functions` holds every item it depends on."""
    of = functions[decl.of]
    size = flat_size(of, functions)
    if size > MAX_FLAT_STATEMENTS:
        loc = decl.loc
        raise VerifyError(
            f"{decl.kind} @{decl.of}: with its calls inlined @{decl.of} runs {size:,} statements, "
            f"more than the {MAX_FLAT_STATEMENTS:,} a gradient may copy (a function called "
            f"twice by each of a chain of callers is copied once per call); differentiate "
            f"a function that calls less", loc.line if loc else 0, loc.col if loc else 0)
    seeds = set(seed_names(of.params, len(of.result_types))) if decl.kind == "vjp" else set()
    flat = flatten(of, functions, reserved=seeds)
    return adjoint(flat, decl.kind, decl.wrt, decl.name)


def _dependency_order(module: Module) -> list[Function | GradDecl]:
    """Items with everything they call or differentiate before them (the module is acyclic)."""
    def deps(item: Function | GradDecl) -> list[str]:
        if isinstance(item, GradDecl):
            return [item.of]
        return [s.attr["callee"] for s in item.body if s.op == "call"]

    order: list[Function | GradDecl] = []
    placed: set[str] = set()
    for root in module.items:
        stack = [(root, iter(deps(root)))]
        while stack:
            item, pending = stack[-1]
            dep = next((d for d in pending if d not in placed), None)
            if dep is not None:
                stack.append((module[dep], iter(deps(module[dep]))))
            elif item.name not in placed:
                placed.add(item.name)
                order.append(item)
                stack.pop()
            else:
                stack.pop()
    return order
