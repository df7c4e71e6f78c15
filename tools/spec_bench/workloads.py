#!/usr/bin/env python3
"""workloads.py - the prompt sets of `lumen bench --spec` (docs/benchmarks.md).

Writes three JSONL files (one {"prompt": TEXT} per line) from the Python
sources of this machine's standard library, taking only the files the demo
model's training held out (tools/train_demo/train.py: is_heldout, sha1 of the
path relative to the library's parent folder, 0 mod 50):

  code.jsonl  code completion: a file's text up to and including the first
              line of a public function with a docstring (the model writes
              the body);
  chat.jsonl  chat: "Write a Python function `NAME`: <docstring's first
              paragraph>" in the demo's chat template, thinking off (the
              demo was trained on such requests);
  edit.jsonl  edit this file: up to 60 lines of a file, a comment saying the
              same code follows with a name changed, and the first line of
              it again: the answer copies most of the prompt.

Usage: python3 tools/spec_bench/workloads.py OUT_DIR [N]   (N prompts a set, 16)
"""
import ast
import glob
import hashlib
import json
import os
import sys
import sysconfig


def is_heldout(rel):
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50 == 0


def held_files():
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, os.path.dirname(root))
        if not is_heldout(rel) or "test" in rel:
            continue
        try:
            raw = open(path, "rb").read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if 200 <= len(raw) <= 200_000:
            out.append((rel, text))
    return out


def functions(text):
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and len(doc.strip()) >= 15 and node.body:
                out.append(node)
    return sorted(out, key=lambda n: n.lineno)


def main():
    out_dir = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    os.makedirs(out_dir, exist_ok=True)
    code, chat, edit = [], [], []
    for rel, text in held_files():
        lines = text.split("\n")
        fns = functions(text)
        if fns and len(code) < n:
            f = fns[0]
            # the file up to the function's docstring end, its last 1500 characters
            end = f.body[0].end_lineno
            code.append("\n".join(lines[:end])[-1500:] + "\n")
        if fns and len(chat) < n:
            f = fns[-1]
            first = ast.get_docstring(f).strip().split("\n\n")[0].replace("\n", " ").strip()
            req = f"Write a Python function `{f.name}`: {first}"
            chat.append(f"<|im_start|>user\n{req}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        if fns and len(edit) < n:
            f = fns[0]
            body = "\n".join(lines[f.lineno - 1:f.lineno + 59])
            new = f.name + "_v2"
            edit.append(f"{body}\n\n\n# The same code again, with `{f.name}` renamed to `{new}`:\n\n"
                        + lines[f.lineno - 1].replace(f.name, new, 1) + "\n")
        if len(code) >= n and len(chat) >= n and len(edit) >= n:
            break
    for name, items in (("code", code), ("chat", chat), ("edit", edit)):
        with open(os.path.join(out_dir, name + ".jsonl"), "w") as fh:
            for p in items:
                fh.write(json.dumps({"prompt": p}) + "\n")
        print(f"{name}: {len(items)} prompts")


if __name__ == "__main__":
    main()
