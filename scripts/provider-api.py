#!/usr/bin/env python3
"""Lists the REST API a provider's generated Python client carries.

The providers publish their current API as the generated clients inside
their SDK wheels (E2B: openapi-python-client in `e2b/api/client`; Daytona:
openapi-generator in `daytona_api_client` and `daytona_toolbox_api_client`).
This reads a wheel without installing or importing it and prints one line
per route, model and enum, sorted, so two listings diff cleanly:

    route POST /v2/sandboxes body=NewSandboxV2 headers=Idempotency-Key -> 201:Sandbox 400:Error
    model Sandbox: clientID! envdVersion! sandboxID! templateID! alias domain
    enum SandboxState: paused running

`name!` is a field the client requires (a response without it fails to
parse); the other fields may be left out. Usage: provider-api.py WHEEL_OR_DIR...
"""

import ast
import os
import re
import sys
import zipfile


def text_of(node):
    """A string constant, or an f-string with its fields as `{name}`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    return None


def subscript_keys(tree, name):
    """Keys of `name["key"] = …` assignments anywhere in `tree`."""
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == name
                ):
                    key = text_of(target.slice)
                    if key:
                        keys.add(key)
    return keys


def e2b_route(tree):
    """One route of openapi-python-client: `_get_kwargs` and `_parse_response`."""
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    kwargs = functions.get("_get_kwargs")
    if kwargs is None:
        return None
    method = url = None
    for node in ast.walk(kwargs):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if text_of(key) == "method":
                    method = text_of(value)
                if text_of(key) == "url":
                    url = text_of(value)
    if not method or not url:
        return None
    url = re.sub(r"\{([a-z_]+)\}", lambda m: "{" + m.group(1) + "}", url)
    body = None
    for arg in kwargs.args.kwonlyargs:
        if arg.arg == "body" and arg.annotation is not None:
            body = ast.unparse(arg.annotation)
    query = sorted(subscript_keys(kwargs, "params"))
    headers = sorted(k for k in subscript_keys(kwargs, "headers") if k != "Content-Type")
    answers = []
    parse = functions.get("_parse_response")
    for node in ast.walk(parse) if parse else []:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            right = node.test.comparators[0]
            if isinstance(right, ast.Constant) and isinstance(right.value, int):
                model = "-"
                for inner in ast.walk(node):
                    if (
                        isinstance(inner, ast.Call)
                        and isinstance(inner.func, ast.Attribute)
                        and inner.func.attr == "from_dict"
                    ):
                        model = ast.unparse(inner.func.value)
                        break
                answers.append(f"{right.value}:{model}")
    return format_route(method, url, body, query, headers, sorted(set(answers)))


def format_route(method, path, body, query, headers, answers):
    line = f"route {method.upper()} {path}"
    if body:
        line += f" body={body}"
    if query:
        line += " query=" + ",".join(query)
    if headers:
        line += " headers=" + ",".join(headers)
    return line + " -> " + (" ".join(answers) if answers else "?")


def model_lines(tree, fields_of):
    """`model` and `enum` lines of a module's classes; `fields_of(cls)` gives a
    model's `{json name: required}`, or `None` for a class that is no model."""
    lines = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        if "Enum" in " ".join(ast.unparse(b) for b in cls.bases):
            lines.append(enum_line(cls))
            continue
        fields = fields_of(cls)
        if fields:
            lines.append(format_model(cls.name, fields))
    return lines


def e2b_fields(cls):
    """openapi-python-client: required fields are `d.pop("x")` in `from_dict`."""
    fields = {}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "pop"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "d"
            and node.args
        ):
            name = text_of(node.args[0])
            if name:
                fields[name] = len(node.args) == 1
    return fields


def enum_line(cls):
    """`enum Name: value ...` for an enum class, values sorted."""
    values = sorted(
        text_of(n.value) or ast.unparse(n.value) for n in cls.body if isinstance(n, ast.Assign)
    )
    return f"enum {cls.name}: " + " ".join(values)


def format_model(name, fields):
    required = sorted(f + "!" for f, req in fields.items() if req)
    optional = sorted(f for f, req in fields.items() if not req)
    return f"model {name}: " + " ".join(required + optional)


def keyword(call, name):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def daytona_routes(tree):
    """Routes of openapi-generator: `_x_serialize` and `x`'s response map."""
    lines = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        for name, function in methods.items():
            if not (name.startswith("_") and name.endswith("_serialize")):
                continue
            public = methods.get(name[1 : -len("_serialize")])
            method = path = None
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "param_serialize"
                ):
                    method = text_of(keyword(node, "method"))
                    path = text_of(keyword(node, "resource_path"))
            if not method or not path:
                continue
            query = set()
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "append"
                    and ast.unparse(node.func.value) == "_query_params"
                    and node.args
                    and isinstance(node.args[0], ast.Tuple)
                ):
                    key = text_of(node.args[0].elts[0])
                    if key:
                        query.add(key)
            headers = {
                k
                for k in subscript_keys(function, "_header_params")
                if k not in ("Accept", "Content-Type")
            }
            body = None
            answers = []
            if public is not None:
                annotations = {a.arg: a.annotation for a in public.args.args}
                for node in ast.walk(function):
                    if (
                        isinstance(node, ast.Assign)
                        and ast.unparse(node.targets[0]) == "_body_params"
                        and isinstance(node.value, ast.Name)
                    ):
                        annotation = annotations.get(node.value.id)
                        body = ast.unparse(annotation) if annotation is not None else "?"
                    if (
                        isinstance(node, ast.Call)
                        and ast.unparse(node.func) == "_files.__setitem__"
                    ):
                        body = "multipart"
                if subscript_keys(function, "_files") or any(
                    isinstance(n, ast.Call)
                    and ast.unparse(n.func) == "_form_params.append"
                    for n in ast.walk(function)
                ):
                    body = "multipart"
                for node in ast.walk(public):
                    if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_response_types_map":
                        for key, value in zip(node.value.keys, node.value.values):
                            answers.append(f"{text_of(key)}:{text_of(value) or '-'}")
            lines.append(
                format_route(method, path, body, sorted(query), sorted(headers), sorted(answers))
            )
    return lines


def daytona_fields(cls):
    """openapi-generator: pydantic fields, required without a default."""
    if "BaseModel" not in [ast.unparse(b) for b in cls.bases]:
        return None
    fields = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        field = node.target.id
        if field == "additional_properties" or field.startswith("__"):
            continue
        alias = field
        required = node.value is None
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "Field":
            for kw in ("serialization_alias", "alias"):
                given = keyword(node.value, kw)
                if given is not None:
                    alias = text_of(given) or alias
                    break
            required = keyword(node.value, "default") is None and (
                keyword(node.value, "default_factory") is None
            )
        elif node.value is not None:
            required = False
        fields[alias] = required
    return fields


def sources(path):
    """`(name, text)` of every Python file in a wheel, or in a directory laid
    out like one (a client's source tree in a provider's repository)."""
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for file in files:
                if file.endswith(".py"):
                    full = os.path.join(root, file)
                    with open(full, encoding="utf-8") as f:
                        yield os.path.relpath(full, path), f.read()
        return
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith(".py"):
                yield name, archive.read(name).decode("utf-8")


def listing(path):
    """Every line of one wheel's (or source tree's) listing, sorted."""
    lines = set()
    for name, source in sources(path):
        if "/api/client/api/" in name:
            route = e2b_route(ast.parse(source))
            if route:
                lines.add(route)
        elif "/api/client/models/" in name:
            lines.update(model_lines(ast.parse(source), e2b_fields))
        elif re.search(r"daytona_[a-z_]*api_client/api/[a-z_]+_api\.py$", name):
            lines.update(daytona_routes(ast.parse(source)))
        elif re.search(r"daytona_[a-z_]*api_client/models/[a-z0-9_]+\.py$", name):
            lines.update(model_lines(ast.parse(source), daytona_fields))
    order = {"route": 0, "model": 1, "enum": 2}
    return sorted(lines, key=lambda l: (order[l.split(" ", 1)[0]], l))


def main(wheels):
    if not wheels:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for wheel in wheels:
        for line in listing(wheel):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
