#!/usr/bin/env python3
"""Layering and documentation checks of mkernel (python3 standard library only).

  scripts/check_layers.py [--root DIR] [--strict-asm] [--layers | --docs] [-v]

Default: both checks. Exit 0 when clean, 1 with a list of problems otherwise.

--layers: the `#include "..."` graph of src/ and fused/ (a quoted include resolves
  relative to the including file, then to src/, then to the repo root, then include/):
  (a) no cycle between files;
  (b) no cycle between modules (src/<dir>, fused/<dir>; src/device/rt and
      fused/ops/<op> are modules of their own);
  (c) no include pointing up the layer order of LAYERS below;
  (d) inline assembly (`asm`, `asm volatile`, `__asm__`) only in ASM_HOME (the device
      runtime's PTX files): a warning, or a failure with --strict-asm (the ctest passes it).
  Quoted includes that resolve nowhere fail too (a header that does not exist).
--docs: every path named in README.md and docs/*.md exists: file paths with a slash and a
  source/doc extension (.h .cuh .cc .cu .md .sh ...; {a,b} alternatives and * globs
  expand), and folder paths under a top-level folder (src/x/, fused/x); relative to the
  repo root, src/, include/, tests/ or the document's folder. Paths into other projects
  (DOC_EXTERNAL) and the installed tree (DOC_INSTALLED) are skipped.
"""
import argparse
import fnmatch
import glob
import os
import re
import sys

# ---------------------------------------------------------------------------------------
# The layer order (docs/architecture.md draws it; /work/shared/DESIGN.md §2 explains it).
# An include may point to its own layer or below, never above. Kept in this one table so
# that the checker, the docs and the build agree on a single definition of "below":
# - base is the ground everything stands on (checks, logging, params, CUDA wrappers);
# - the device runtime is the leaf of all device code (PTX set, bounded wait, error
#   record), so collectives, the device communication API and fused kernels share it;
# - comm is the communicator object every host layer reads;
# - bootstrap/topo build a comm, transport moves bytes between its ranks;
# - coll, the device kernels and fused operators are peers on top of transport;
# - the exported API is a thin shell over all of them.
# Keys are module names (see module_of); a value is (rank, layer name).
LAYERS = {
    "src/base": (0, "base"),
    "src/device/rt": (1, "device runtime"),
    "src/comm": (2, "comm"),
    "src/bootstrap": (3, "bootstrap/topo"),
    "src/topo": (3, "bootstrap/topo"),
    "src/transport": (4, "transport"),
    "src/coll": (5, "coll/device/fused"),
    "src/device": (5, "coll/device/fused"),
    "fused/*": (5, "coll/device/fused"),  # every fused/<dir> and fused/ops/<op>
    "src/api": (6, "api"),
}

# Directories whose sub-directories are modules of their own ("*": every sub-directory).
SUBMODULES = {"src/device": {"rt"}, "fused/ops": "*"}

# Module edges ignored by the module-cycle check, each with the reason it still exists.
# The checker warns when an entry no longer matches any include, so that it gets removed.
ALLOWED_MODULE_EDGES = {}

# Where inline assembly may live: the device runtime's PTX set (fnmatch patterns).
ASM_HOME = ("src/device/rt/ptx*", "src/device/rt/*asm*")

SCAN_DIRS = ("src", "fused")
SOURCE_EXT = (".h", ".hpp", ".cuh", ".cc", ".cpp", ".cu", ".inl", ".inc", ".def")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
ASM_RE = re.compile(r"\b(?:__asm__|__asm|asm)\b(?:\s+(?:volatile|__volatile__))?\s*\(")


def rel(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


def source_files(root):
    for top in SCAN_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield rel(root, os.path.join(d, f))


def strip_comments_and_strings(text):
    """Blanks out comments and string/char literals (keeps newlines, so lines still count)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(path):
    parts = path.split("/")
    if len(parts) < 3:
        return parts[0]
    mod = parts[0] + "/" + parts[1]
    subs = SUBMODULES.get(mod)
    if subs and len(parts) > 3 and (subs == "*" or parts[2] in subs):
        mod += "/" + parts[2]
    return mod


def layer_of(mod):
    if mod in LAYERS:
        return LAYERS[mod]
    top = mod.split("/")[0] + "/*"
    return LAYERS.get(top)


def resolve(root, src, inc):
    for base in (os.path.dirname(src), "src", "", "include"):
        cand = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def find_cycles(graph):
    """Strongly connected components with more than one node (or a self loop), sorted."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # iterative Tarjan: include chains can be deep
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in graph.get(node, ()):
                    sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(sccs)


def one_cycle(graph, comp):
    """A shortest cycle through the first node of an SCC, for a readable message."""
    members, start = set(comp), comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def check_layers(root, strict_asm, verbose):
    errors, warnings = [], []
    files = list(source_files(root))
    fgraph, where = {}, {}  # file -> included files; (a, b) -> "a:line"
    asm_hits = []
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        fgraph.setdefault(f, set())
        for m in INCLUDE_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(root, f, m.group(1))
            if target is None:
                errors.append(f'{f}:{line}: #include "{m.group(1)}" resolves to no file')
                continue
            if not target.startswith(tuple(d + "/" for d in SCAN_DIRS)):
                continue  # public headers (include/) are below everything
            fgraph[f].add(target)
            where.setdefault((f, target), f"{f}:{line}")
        code = strip_comments_and_strings(text)
        for m in ASM_RE.finditer(code):
            if not any(fnmatch.fnmatch(f, p) for p in ASM_HOME):
                asm_hits.append(f"{f}:{code.count(chr(10), 0, m.start()) + 1}")

    # (a) file cycles
    for comp in find_cycles(fgraph):
        cyc = one_cycle(fgraph, comp)
        errors.append("file include cycle: " + " -> ".join(cyc))

    # (b) module cycles, (c) upward includes
    mgraph, medges, used_allow = {}, {}, set()
    for a, targets in fgraph.items():
        ma = module_of(a)
        mgraph.setdefault(ma, set())
        for b in targets:
            mb = module_of(b)
            la, lb = layer_of(ma), layer_of(mb)
            if la is None or lb is None:
                errors.append(f"{where[(a, b)]}: module {ma if la is None else mb} is not in LAYERS")
                continue
            if lb[0] > la[0]:
                errors.append(f'{where[(a, b)]}: upward include of "{b}": '
                              f"{ma} ({la[1]}) -> {mb} ({lb[1]})")
            if ma == mb:
                continue
            medges.setdefault((ma, mb), []).append(where[(a, b)])
            if (ma, mb) in ALLOWED_MODULE_EDGES:
                used_allow.add((ma, mb))
                continue
            mgraph[ma].add(mb)
    for comp in find_cycles(mgraph):
        steps = []
        for x in comp:
            for y in sorted(mgraph[x] & set(comp)):
                sites = medges[(x, y)]
                more = f" (+{len(sites) - 1} more)" if len(sites) > 1 else ""
                steps.append(f"    {x} -> {y}: {sites[0]}{more}")
        errors.append("module cycle: " + " -> ".join(one_cycle(mgraph, comp)) +
                      f"; edges inside the cycle of {len(comp)} modules:\n" + "\n".join(steps))
    for edge, why in sorted(ALLOWED_MODULE_EDGES.items()):
        if edge in used_allow:
            warnings.append(f"allow-listed module edge {edge[0]} -> {edge[1]}: {why} "
                            f"({len(medges[edge])} includes, e.g. {medges[edge][0]})")
        else:
            warnings.append(f"allow-listed module edge {edge[0]} -> {edge[1]} no longer "
                            "exists: remove it from ALLOWED_MODULE_EDGES")

    # (d) inline assembly outside the PTX layer
    if asm_hits:
        home = " or ".join(ASM_HOME)
        msg = f"inline asm outside {home} ({len(asm_hits)}): " + ", ".join(asm_hits)
        (errors if strict_asm else warnings).append(msg)

    if verbose:
        for (a, b), sites in sorted(medges.items()):
            print(f"  {a} -> {b}  ({len(sites)})")
    return errors, warnings, len(files)


# A path in a document: segments joined by "/", ending in a known extension, or (for
# folders) starting at a top-level folder of the repository. "{a,b}" alternatives expand.
_SEG = r"(?:[\w.*-]+|\{[\w.,*-]+\})"
DOC_FILE_RE = re.compile(
    r"(?<![\w./$-])(" + _SEG + r"(?:/" + _SEG + r")+"
    r"\.(?:h|hpp|cuh|cc|cpp|cu|inl|inc|def|md|sh|py|txt|json|map|\{[\w,]+\}))(?![\w/{<])")
_DIRSEG = r"(?:[\w*-]+|\{[\w,*-]+\})"
# Folders: "src/x/" anywhere, or "src/x" / "fused/x" / "include/x" without the slash (the
# other top-level folders also hold build outputs that documents name, e.g. tests/mk_...).
DOC_DIR_RE = (r"(?<![\w./$-])((?:{tops})/(?:" + _DIRSEG + r"/)*(?:" + _DIRSEG + r"/?)?)"
              r"(?![\w<{*/-]|\.\w|\.\{)")

SRC_TOPS = ("src/", "fused/", "include/")
# Paths that documents name inside other projects' sources (not ours to check).
DOC_EXTERNAL = ("torch/csrc/", "nccl/src/", "nccl-tests/src/")
# Paths of the installed tree (cmake --install) that share a name with a source folder.
DOC_INSTALLED = ("include/mkernel/nccl/",)


def expand_braces(token):
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(token[: m.start()] + alt + token[m.end():])
    return out


def check_docs(root):
    errors = []
    docs = ["README.md"] + sorted(
        "docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    tops = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))
                  and not d.startswith((".", "build")))
    dir_re = re.compile(DOC_DIR_RE.replace("{tops}", "|".join(map(re.escape, tops))))
    for doc in docs:
        with open(os.path.join(root, doc), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")
        bases = ("", "src", "include", "tests", os.path.dirname(doc))
        for no, line in enumerate(lines, 1):
            line = re.sub(r"https?://\S+", " ", line)  # URLs name other sites' files
            tokens = [m.group(1) for m in DOC_FILE_RE.finditer(line)]
            tokens += [m.group(1) for m in dir_re.finditer(line)
                       if m.group(1).endswith("/") or m.group(1).startswith(SRC_TOPS)]
            for path in sorted(set(p for t in tokens for p in expand_braces(t))):
                if path.startswith(DOC_EXTERNAL + DOC_INSTALLED + ("build", "/", "../")):
                    continue  # not in this repository (or a build output)
                found = any(glob.glob(os.path.join(root, b, path)) for b in bases)
                if not found:
                    errors.append(f"{doc}:{no}: names {path}, which does not exist")
    return errors, len(docs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--strict-asm", action="store_true", help="inline asm outside the PTX layer fails")
    ap.add_argument("--layers", action="store_true", help="only the include-graph checks")
    ap.add_argument("--docs", action="store_true", help="only the documentation path check")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the module graph")
    args = ap.parse_args()
    both = not args.layers and not args.docs
    errors, warnings = [], []
    if args.layers or both:
        e, w, n = check_layers(args.root, args.strict_asm, args.verbose)
        errors += e
        warnings += w
        print(f"check_layers: {n} files in {'/, '.join(SCAN_DIRS)}/: {len(e)} problems")
    if args.docs or both:
        e, n = check_docs(args.root)
        errors += e
        print(f"check_layers: {n} documents: {len(e)} missing paths")
    for w in warnings:
        print("warning: " + w)
    for e in errors:
        print("error: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
