"""An arm's identity is the code it trains: a hash of the syntax tree of its class, of what that class reads in its
module, and of every module of the user's own that its module imports.

An arm's name says which arm a run trained, not which code: a gate edited from 1.0 to 0.5 between two seeds keeps
its name, its config and every fingerprint, and a table would average the two arms as one. So each run records its
arm's identity in its summary (`arm_source`, and every one it trained under in `arm_sources`), and the tables refuse
a row whose seeds differ in it (`ablate.analysis.matching`) or whose code is not the arm's code now
(`ablate.analysis.armcode`).

What the identity covers (scheme "v2", the prefix of every value), by a rule that depends on neither the order of
imports nor where the checkout lies:
* each class of the arm's class hierarchy but the house's `Arm` (ablate.arms.base) and library classes (torch's,
  the standard library's, `object`): the class statement itself and every module-level statement it reads, named
  or through one that it reads (a constant, a helper function, `from gates import GATE`), and a module-level
  assignment to one of their attributes; never the rest of the file, so the Experiment declaration beside an arm in
  an experiment file, or a neighbouring arm in `ablate/arms/builtin.py`, is not part of it;
* every module reachable by imports (anywhere in the file, followed from module to module) from the modules that
  define those classes, whole, except the interpreter's own (its prefix, the standard library, site-packages) and
  the ablate package (the house's code, recorded by the commit).
Each piece is hashed as its syntax tree (`ast.dump`, without line numbers and docstrings), so comments, blank lines,
formatting and docstrings stay out, and is named by its module name and qualified name, never by a file path: a
moved checkout or another torch install gives the same identity.

The identity is taken as the class is registered (`register_arm`), of the source as it was imported: a module is
read once per module object, so a worker that keeps `import gates` cached while gates.py is edited mid-grid records
the gates it trains with, and an experiment file executed again (each run of a worker) is read again.

A run recorded under the older scheme (a bare sha256 of whole files) is not compared with one of this scheme:
`OLDER_SCHEME` says so wherever it matters. Torch-free.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import site
import sys
import sysconfig
import weakref
from pathlib import Path

ARM_SOURCE = "arm_source"  # the summary key of the identity the run last trained under
SCHEME = "v2"  # the identity's scheme: the prefix of every value it gives
OLDER_SCHEME = "arm identity of an older scheme: not compared"
NO_SOURCE = "<no source>"
HOUSE_BASE = "ablate.arms.base"  # the module of `Arm`, the house's base: never part of an arm's identity
ABLATE = Path(__file__).resolve().parents[1]  # the ablate package: the house's code, recorded by the commit

_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module → its source as first read (≈ imported)


def registered_identity(name: str) -> str | None:
    """The identity of the arm registered as `name` in this process, None when none is (the arms are not loaded
    here): read from the registry where it lies, without importing it, so that torch-free readers (`ablate.status`)
    compare a run's recorded identity with the arm's code now."""
    registry = getattr(sys.modules.get(HOUSE_BASE), "_REGISTRY", {})
    return arm_identity(registry[name]) if name in registry else None


def is_stale(recorded: object, name: str) -> bool:
    """Whether a run's recorded identity (of this scheme) is not the code of the arm registered as `name` now (an
    identity of an older scheme, or an arm not registered here, is not compared)."""
    now = registered_identity(name)
    return current_scheme(recorded) and now is not None and recorded != now


def registering_file(depth: int = 2) -> str | None:
    """The file of the module whose code called `register_arm(...)(cls)` (`depth` frames above this call)."""
    return sys._getframe(depth).f_globals.get("__file__")


def current_scheme(identity: object) -> bool:
    """Whether a recorded identity is of this scheme (older runs hold a bare sha256, or none)."""
    return isinstance(identity, str) and identity.startswith(SCHEME + ":")


def arm_identity(cls: type) -> str:
    """The arm's identity, as taken when it was registered (`register_arm` keeps it on the class); computed now for a
    class that was never registered."""
    kept = vars(cls).get("arm_identity")
    return kept if isinstance(kept, str) else compute_identity(cls)


def compute_identity(cls: type) -> str:
    """`SCHEME:` + sha256 over the pieces of code the arm runs (see the module's docstring), sorted by name."""
    pieces: dict[str, str] = {}
    modules = []
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if klass.__module__ == HOUSE_BASE or interpreter_module(klass.__module__, module):
            continue
        pieces[f"class {klass.__module__}:{klass.__qualname__}"] = class_code(klass, module)
        modules.append(klass.__module__)
    for name in reachable_modules(modules):
        pieces[f"module {name}"] = module_code(name)
    text = json.dumps(sorted(pieces.items()), separators=(",", ":"))
    return f"{SCHEME}:{hashlib.sha256(text.encode()).hexdigest()}"


# ---------------------------------------------------------------------------------------------- sources
def module_file(name: str, module=None) -> str | None:
    """The file a module was imported from, or would be (found without importing anything); None for a built-in,
    frozen or namespace module, or one not found."""
    module = module if module is not None else sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    spec, path = None, None
    for depth in range(1, name.count(".") + 2):
        part = ".".join(name.split(".")[:depth])
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, path)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec.origin if spec is not None and spec.has_location else None


def library_module(name: str, module=None) -> bool:
    """The interpreter's (`interpreter_module`) or the house's (ablate): a module whose imports are not followed."""
    return name == "ablate" or name.startswith("ablate.") or interpreter_module(name, module)


def interpreter_module(name: str, module=None) -> bool:
    """A module of the interpreter's: under its prefix, the standard library or site-packages, or built in (a class
    of one, torch's `Module` or `object`, is never part of an arm's identity)."""
    file = module_file(name, module)
    if file is None:
        return name in sys.builtin_module_names or name in sys.stdlib_module_names  # else `__main__` of `-c`: own
    path = Path(file).resolve()
    return any(path.is_relative_to(root) for root in _interpreter_roots())


@functools.lru_cache(maxsize=1)
def _interpreter_roots() -> list[Path]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
             site.getusersitepackages(), *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib",
                                                                                  "purelib", "platlib"))}
    return [Path(root).resolve() for root in roots if root]


def source_text(name: str) -> str | None:
    """A module's source as it was imported: read once per module object (a module imported again is a new object,
    read again); a module not imported is read from its file now."""
    module = sys.modules.get(name)
    if module is not None and module in _TEXTS:
        return _TEXTS[module]
    file = module_file(name, module)
    try:
        text = Path(file).read_text(encoding="utf-8") if file and file.endswith(".py") else None
    except (OSError, UnicodeDecodeError):
        text = None
    if module is not None and text is not None:
        _TEXTS[module] = text
    return text


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> ast.Module | None:
    """A module's tree, parsed once per text (every arm of builtin.py reads one); never changed by its readers."""
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


@functools.lru_cache(maxsize=64)
def statement_dumps(text: str) -> tuple[str, ...]:
    """Each top-level statement's syntax tree (`ast.dump`, without line numbers), docstrings left out (the module's
    own reads as `pass`, so that the indices stay those of `_parse(text).body`): comments, formatting and docstrings
    stay out of the identity. Once per text."""
    tree = ast.parse(text)  # a tree of its own: the docstrings are taken out in place
    for item in ast.walk(tree):
        body = getattr(item, "body", None)
        if (isinstance(item, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            item.body = ([ast.Pass()] + body[1:]) if isinstance(item, ast.Module) else (body[1:] or [ast.Pass()])
    return tuple(ast.dump(stmt, include_attributes=False) for stmt in tree.body)


def module_code(name: str) -> str:
    text = source_text(name)
    return "\n".join(statement_dumps(text)) if text is not None and _parse(text) is not None else NO_SOURCE


# ---------------------------------------------------------------------------------------------- a class's own code
def class_code(klass: type, module=None) -> str:
    """The class statement and every module-level statement it reads (a name it uses that the statement binds,
    followed through what that statement reads), and module-level assignments to their attributes, in file order.
    A class defined inside a function or another class counts by the top-level statement that holds it."""
    text = source_text(klass.__module__)
    found = _top_level_index(text, klass) if text is not None and _parse(text) is not None else None
    if found is None:
        return f"{NO_SOURCE} {klass.__module__}:{klass.__qualname__}"
    facts = _statement_facts(text)
    chosen = {found} | {i for i, (_, _, _, star) in enumerate(facts) if star}
    used = set().union(*(facts[i][1] for i in chosen))
    changed = True
    while changed:
        changed = False
        defined = set().union(*(facts[i][0] for i in chosen))
        for i, (bound, uses, attribute_roots, _) in enumerate(facts):
            if i not in chosen and (bound & used or attribute_roots & defined):
                chosen.add(i)
                used |= uses
                changed = True
    dumps = statement_dumps(text)
    return "\n".join(dumps[i] for i in sorted(chosen))


@functools.lru_cache(maxsize=64)
def _statement_facts(text: str) -> tuple[tuple[frozenset, frozenset, frozenset, bool], ...]:
    """Per top-level statement: the names it binds, the names it uses, the names whose attribute or item it
    assigns (`Gate.window = 16`), and whether it is a star import. Once per text."""
    return tuple((frozenset(_bound(stmt)), frozenset(_used(stmt)), frozenset(_attribute_roots(stmt)),
                  isinstance(stmt, ast.ImportFrom) and any(alias.name == "*" for alias in stmt.names))
                 for stmt in _parse(text).body)


@functools.lru_cache(maxsize=64)
def _class_statements(text: str) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """Qualified name → (top-level index, first line, last line) of each class statement of that name."""
    found: dict[str, list] = {}
    for index, stmt in enumerate(_parse(text).body):
        for node, qualname in _classes(stmt, ""):
            found.setdefault(qualname, []).append((index, node.lineno, node.end_lineno))
    return {name: tuple(places) for name, places in found.items()}


def _top_level_index(text: str, klass: type) -> int | None:
    """The index of the top-level statement that defines `klass` (by its qualified name; between two definitions
    of one name, the one that holds the class's methods' first line)."""
    candidates = _class_statements(text).get(klass.__qualname__, ())
    if len(candidates) > 1:
        lines = [getattr(getattr(v, "__func__", v), "__code__").co_firstlineno for v in vars(klass).values()
                 if hasattr(getattr(v, "__func__", v), "__code__")]
        candidates = [c for c in candidates if any(c[1] <= line <= c[2] for line in lines)] or candidates
    return candidates[-1][0] if candidates else None


def _classes(node: ast.AST, prefix: str):
    """(class node, qualified name) of every class statement in `node`, as Python names them."""
    if isinstance(node, ast.ClassDef):
        qualname = prefix + node.name
        yield node, qualname
        prefix = qualname + "."
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        prefix = prefix + node.name + ".<locals>."
    for child in ast.iter_child_nodes(node):
        yield from _classes(child, prefix)


def _bound(stmt: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds (not those bound inside a function or class it defines)."""
    names, stack = set(), [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name != "*"}
        stack.extend(ast.iter_child_nodes(node))
    return names


def _used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _attribute_roots(stmt: ast.stmt) -> set[str]:
    """The names whose attribute or item a module-level assignment sets (`Gate.window = 16`, `TABLE[k] = v`)."""
    if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return set()
    roots = set()
    for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
        while isinstance(target, (ast.Attribute, ast.Subscript)):
            target = target.value
            if isinstance(target, ast.Name):
                roots.add(target.id)
    return roots


# ---------------------------------------------------------------------------------------------- reachable modules
def reachable_modules(defining: list[str]) -> list[str]:
    """The user's own modules reachable by imports from the `defining` modules (not those themselves), sorted."""
    seen, queue, found = set(defining), list(defining), set()
    while queue:
        name = queue.pop()
        for imported in sorted(imports_of(name)):
            if imported in seen:
                continue
            seen.add(imported)
            if not library_module(imported):
                found.add(imported)
                queue.append(imported)
    return sorted(found)


def imports_of(name: str) -> set[str]:
    """The modules a module's file imports, anywhere in it (a package's parents too, `from p import m`'s m when it
    is a module), relative imports resolved against its package."""
    text = source_text(name)
    if text is None or _parse(text) is None:
        return set()
    module = sys.modules.get(name)
    package = getattr(module, "__package__", None)
    if package is None:
        file = module_file(name, module) or ""
        package = name if file.endswith("__init__.py") else name.rpartition(".")[0]
    names = set()
    for level, base, aliases in _import_statements(text):
        if level < 0:  # `import a.b`
            names |= {prefix for alias in aliases for prefix in _prefixes(alias)}
            continue
        try:
            base = importlib.util.resolve_name("." * level + (base or ""), package) if level else base
        except (ImportError, ValueError):
            continue
        names |= set(_prefixes(base))
        names |= {f"{base}.{alias}" for alias in aliases if alias != "*"
                  and (f"{base}.{alias}" in sys.modules or module_file(f"{base}.{alias}"))}
    return names


@functools.lru_cache(maxsize=64)
def _import_statements(text: str) -> tuple[tuple[int, str | None, tuple[str, ...]], ...]:
    """Every import statement of a text, anywhere in it: (level, module, names); `import a.b` has level -1."""
    return tuple((-1, None, tuple(a.name for a in node.names)) if isinstance(node, ast.Import)
                 else (node.level, node.module, tuple(a.name for a in node.names))
                 for node in ast.walk(_parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
