"""The project's shape: `requests/` holds request handlers and must never
shadow the `requests` HTTP library, in any process of the project; the
rooms' arrows point down: the engine core knows nothing of libvirt, the
hypervisor, placement or the handlers, placement nothing of libvirt, only
the hypervisor room imports libvirt and its rooms import only the rooms
below them, and the error root is the standard library alone; no two
modules import each other, even through others; no module is over 700
lines; and the README's map names only paths that exist."""
import ast
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_requests_from_the_project_root_is_the_http_library():
    where = python("import requests; print(requests.__file__)")
    assert not where.startswith(os.path.join(ROOT, "requests")), where
    assert python("import requests; print(callable(requests.get))") == "True"


def test_handlers_load_without_shadowing_requests():
    out = python("from engine.core.handlers import load_request_handlers\n"
                 "names = sorted(load_request_handlers())\n"
                 "import requests\n"
                 "print(requests.__file__); print(' '.join(names))")
    where, names = out.splitlines()
    assert not where.startswith(os.path.join(ROOT, "requests")), where
    for name in ("ping", "build", "destroy", "start", "stop", "reboot", "suspend", "resume",
                 "claim", "release"):
        assert name in names.split()


def test_peer_process_imports_see_the_http_library():
    out = python("import sys; sys.argv = ['peerctl.py']\n"
                 "import peerctl, engine.peer, engine.hypervisor.host.vmpublish, engine.placement.rest\n"
                 "import requests; print(requests.__file__)")
    assert not out.startswith(os.path.join(ROOT, "requests")), out


def test_requests_folder_is_not_a_package():
    assert not os.path.exists(os.path.join(ROOT, "requests", "__init__.py"))


def imports(path: str, sources: bool = True) -> set[str]:
    """Every module the file at ``path`` imports, anywhere in it (functions
    too), relative imports resolved; ``from a import b`` gives ``a`` and
    ``a.b`` (``a.b`` alone with ``sources=False``: then ``a`` counts only
    when ``b`` is a name defined in it, as the import graph wants)."""
    package = os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, ".")
    with open(path) as source:
        tree = ast.parse(source.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:         # from . import x, from ..y import z
                parts = package.split(".")
                base = parts[:len(parts) - node.level + 1]
                module = ".".join(base + [module]) if module else ".".join(base)
            if sources:
                found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def forbidden_imports(paths, forbidden) -> dict:
    """``{file: [module, ...]}`` for each file importing a ``forbidden`` module
    or anything inside one."""
    found = {}
    for path in paths:
        bad = sorted(name for name in imports(path)
                     if any(name == f or name.startswith(f + ".") for f in forbidden))
        if bad:
            found[os.path.relpath(path, ROOT)] = bad
    return found


def room(*parts) -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, *parts, "*.py")))


ERRORS = os.path.join(ROOT, "engine", "errors.py")


def test_the_engine_core_imports_nothing_above_it():
    assert room("engine", "core"), "no engine/core/*.py found"
    above = ["libvirt", "engine.hypervisor", "engine.placement", "peerctl_requests",
             "requests", "engine.peer", "engine.cluster", "engine.supervisor",
             "engine.operations.scrub"]
    assert forbidden_imports(room("engine", "core") + [ERRORS], above) == {}


def test_placement_imports_neither_libvirt_nor_the_hypervisor_nor_the_handlers():
    assert room("engine", "placement"), "no engine/placement/*.py found"
    above = ["libvirt", "engine.hypervisor", "peerctl_requests"]
    assert forbidden_imports(room("engine", "placement"), above) == {}


def test_leases_sit_on_the_core_and_placement_only():
    assert room("engine", "leases"), "no engine/leases/*.py found"
    above = ["libvirt", "engine.hypervisor", "peerctl_requests", "engine.peer"]
    assert forbidden_imports(room("engine", "leases"), above) == {}


def test_only_the_launcher_imports_the_command_line():
    """engine/commandline/ sits on top of every room: nothing imports it
    but peerctl.py (the tests may)."""
    everything = [path for path in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
                  if not os.path.relpath(path, ROOT).startswith(("tests", "bench", "peerctl.py",
                                                                 "build" + os.sep))]
    everything = [path for path in everything
                  if not os.path.relpath(path, ROOT).startswith("engine/commandline/")]
    assert forbidden_imports(everything, ["engine.commandline", "peerctl"]) == {}


COMMAND_LINE = room("engine", "commandline")
NOUNS = ["vms", "hosts", "moves", "tasks", "leases", "placement", "aside", "admin", "local",
         "backups", "replicas", "snapshots", "tokens"]


def test_no_command_line_module_is_over_400_lines():
    """A noun that grows past a screenful of screens splits, as pip's commands do."""
    assert COMMAND_LINE, "no engine/commandline/*.py found"
    long = {os.path.relpath(path, ROOT): n for path in COMMAND_LINE
            if (n := sum(1 for _ in open(path))) > 400}
    assert long == {}


def test_no_noun_module_imports_another():
    """Each noun stands on the framework and the operations layer only."""
    paths = [os.path.join(ROOT, "engine", "commandline", f"{noun}.py") for noun in NOUNS]
    assert all(os.path.exists(path) for path in paths)
    found = {}
    for noun, path in zip(NOUNS, paths):
        others = [f"engine.commandline.{other}" for other in NOUNS if other != noun]
        found.update(forbidden_imports([path], others))
    assert found == {}


def test_the_operations_layer_imports_neither_argparse_nor_the_command_line():
    """A second face (the HTTP API) calls it as the command line does."""
    assert room("engine", "operations"), "no engine/operations/*.py found"
    above = ["argparse", "engine.commandline", "peerctl", "sys"]
    assert forbidden_imports(room("engine", "operations"), above) == {}


def test_the_error_root_imports_the_standard_library_only():
    outside = sorted(name for name in imports(ERRORS)
                     if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"})
    assert outside == []


def test_importing_the_error_root_loads_neither_grpc_nor_libvirt():
    loaded = python("import sys, engine.errors\n"
                    "print(' '.join(sorted(m for m in sys.modules\n"
                    "                      if m.split('.')[0] in ('grpc', 'libvirt'))))")
    assert loaded == ""


def test_no_test_module_imports_another():
    """Shared test helpers live in tests/support, never in another test module."""
    tests = room("tests")
    assert tests, "no tests/*.py found"
    found = {os.path.relpath(path, ROOT): sorted(name for name in imports(path)
                                                 if name.startswith("tests.test_"))
             for path in tests}
    assert {path: names for path, names in found.items() if names} == {}


# -- the hypervisor's rooms ---------------------------------------------------

HYPERVISOR_ROOMS = {            # room: the rooms below it that it may import
    "local": [],
    "domain": [],
    "storage": ["domain"],
    "host": ["domain", "storage"],
    "data": ["domain", "storage"],
    "moves": ["domain", "storage", "host", "data"],
    "ha": ["domain", "local"],
}


def test_the_hypervisor_room_is_made_of_its_rooms_only():
    loose = [os.path.basename(path) for path in room("engine", "hypervisor")
             if os.path.basename(path) != "__init__.py"]
    assert loose == []
    found = sorted(os.path.basename(os.path.dirname(path)) for path in
                   glob.glob(os.path.join(ROOT, "engine", "hypervisor", "*", "__init__.py")))
    assert found == sorted(HYPERVISOR_ROOMS)


def test_each_hypervisor_room_imports_only_the_rooms_below_it():
    found = {}
    for name, below in HYPERVISOR_ROOMS.items():
        assert room("engine", "hypervisor", name), f"no engine/hypervisor/{name}/*.py found"
        others = [f"engine.hypervisor.{other}" for other in HYPERVISOR_ROOMS
                  if other != name and other not in below]
        found.update(forbidden_imports(room("engine", "hypervisor", name), others))
    assert found == {}


def project_modules(*tops) -> list[str]:
    """The project's Python files under ``tops`` (all of them by default)."""
    paths = glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
    paths = [path for path in paths if "/." not in os.path.relpath(path, ROOT)
             and not os.path.relpath(path, ROOT).startswith("build" + os.sep)]
    if tops:
        paths = [path for path in paths if os.path.relpath(path, ROOT).startswith(tops)]
    return sorted(paths)


def test_only_the_hypervisor_room_imports_libvirt():
    """Domain knowledge belongs to one room: the API's console and metrics
    ask it (engine/hypervisor/host/console_stream.py, domain_stats.py)."""
    outside = [path for path in project_modules("engine", "automations", "requests", "peerctl.py")
               if not os.path.relpath(path, ROOT).startswith(os.path.join("engine", "hypervisor"))]
    assert forbidden_imports(outside, ["libvirt"]) == {}


def module_name(path: str) -> str:
    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return name.removesuffix(".__init__")


def import_graph(paths) -> dict[str, set[str]]:
    """``{module: {module it imports, ...}}`` among ``paths``: each import
    (in functions too) resolved to the longest module of the project it
    names."""
    modules = {module_name(path): path for path in paths}

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    return {name: {target for imported in imports(path, sources=False)
                   if (target := resolve(imported)) and target != name}
            for name, path in modules.items()}


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of two modules or
    more (Tarjan's algorithm, iterative): each a loop of imports."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_loops_are_found_through_any_number_of_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert loops(graph) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other_even_through_others():
    """A pair (or ring) of modules that import each other, at the top or in
    a function, is one idea in two files or a name in the wrong one: the
    shared names move down to where both can look at them."""
    paths = [path for path in project_modules()
             if not os.path.basename(path).startswith("test_")]
    assert loops(import_graph(paths)) == []


def test_no_module_is_over_700_lines():
    long = {os.path.relpath(path, ROOT): n for path in project_modules()
            if (n := sum(1 for _ in open(path))) > 700}
    assert long == {}


# -- the README's map -----------------------------------------------------------

def readme_map() -> str:
    with open(os.path.join(ROOT, "README.md")) as readme:
        text = readme.read()
    start = text.index("\n## Layout")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_readme_map_names_only_paths_that_exist():
    named = [path for path in re.findall(r"`([^`\s]+)`", readme_map())
             if "/" in path or path.endswith((".py", ".md", ".cfg"))]
    assert len(named) >= 10, named
    missing = [path for path in named
               if not os.path.exists(os.path.join(ROOT, path.rstrip("/")))]
    assert missing == []


def test_the_readme_map_names_every_room_of_the_engine():
    named = set(re.findall(r"`([^`\s]+)`", readme_map()))
    rooms = sorted(os.path.relpath(os.path.dirname(path), ROOT) + "/" for path in
                   glob.glob(os.path.join(ROOT, "engine", "*", "__init__.py"))
                   + glob.glob(os.path.join(ROOT, "engine", "hypervisor", "*", "__init__.py")))
    assert [path for path in rooms if path not in named] == []
