#!/usr/bin/env python3
"""Turns docker/compose.yaml plus override files into one `podman run` argument list per service,
for docker/check.sh, which starts every service once without a compose tool (podman-compose would
make a network, and with it a bridge and firewall rules). Not a compose implementation: it knows
the keys dptrain's compose files use, and merges an override the way Docker Compose does for
them (image, command, entrypoint and deploy replaced, `!reset` removes, environment and volumes
merged by name and by mount point).

    compose_runs.py --volume NAME [--append SERVICE-OR-train=ARGS]... [--mount SRC:DST:ro]... FILES...

prints `service<TAB>arguments` lines, the arguments shell-quoted, in the order of the first file.
"""
import argparse
import json
import shlex
import sys

import yaml


class Reset:
    """Compose's `!reset` tag: the key is removed from what the files before it said."""


def reset_constructor(loader, node):
    return Reset()


yaml.SafeLoader.add_constructor("!reset", reset_constructor)


def mount_point(volume):
    return volume.split(":")[1]


def merge_service(base, override):
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Reset):
            merged.pop(key, None)
        elif key == "environment":
            merged[key] = {**merged.get(key, {}), **value}
        elif key == "volumes":
            kept = [v for v in merged.get(key, []) if mount_point(v) not in map(mount_point, value)]
            merged[key] = kept + list(value)
        else:
            merged[key] = value
    return merged


def load_services(paths):
    services = {}
    for path in paths:
        with open(path) as f:
            document = yaml.safe_load(f)
        for name, service in document.get("services", {}).items():
            services[name] = merge_service(services.get(name, {}), service)
    return services


def podman_args(name, service, volume, appends, mounts):
    if "deploy" in service:
        sys.exit(f"error: service {name} still reserves devices (deploy) after the overrides")
    args = ["--name", f"dptrain-check-compose-{name}", "--network", "none"]
    if service.get("init"):
        args.append("--init")
    if "shm_size" in service:
        args += ["--shm-size", str(service["shm_size"])]
    for key, value in service.get("environment", {}).items():
        args += ["-e", f"{key}={value}"]
    for mount in service.get("volumes", []):
        source, rest = mount.split(":", 1)
        args += ["-v", f"{volume if not source.startswith(('/', '.')) else source}:{rest}"]
    for mount in mounts:
        args += ["-v", mount]
    if "entrypoint" in service:
        args += ["--entrypoint", json.dumps(service["entrypoint"])]
    command = list(service.get("command", []))
    for target, extra in appends:
        if target == name or (target == "train" and "train" in command):
            command += shlex.split(extra)
    return args + [service["image"]] + command


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--volume", required=True, help="the volume that stands for named ones")
    parser.add_argument("--append", action="append", default=[],
                        help="SERVICE=ARGS, or train=ARGS for every training command")
    parser.add_argument("--mount", action="append", default=[], help="an extra -v for every run")
    options = parser.parse_args()
    appends = [tuple(a.split("=", 1)) for a in options.append]
    for name, service in load_services(options.files).items():
        args = podman_args(name, service, options.volume, appends, options.mount)
        print(f"{name}\t{shlex.join(args)}")


if __name__ == "__main__":
    main()
