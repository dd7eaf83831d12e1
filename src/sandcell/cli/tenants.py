"""``sandcell tenants``: who may use the service, with which profiles, how much."""

from __future__ import annotations

import argparse
import json
import sys

from sandcell.errors import ConfigError
from sandcell.home import data_dir
from sandcell.policy.profiles import load_profile

MiB = 1024 * 1024


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("tenants", help="the service's tenants: API keys, profiles, quotas")
    ts = t.add_subparsers(dest="tenants_command", required=True)
    add = ts.add_parser("add", help="add a tenant; prints its API key once")
    add.add_argument("name")
    add.add_argument(
        "--profile",
        action="append",
        required=True,
        help="a profile the tenant may use (repeat; the first is its default)",
    )
    add.add_argument("--max-concurrent", type=int, default=4, help="sandboxes at once (4)")
    add.add_argument("--runs-per-minute", type=int, default=60, help="runs and cells a minute (60)")
    add.add_argument(
        "--cpu-seconds-per-day", type=int, default=3600, help="CPU seconds per UTC day (3600)"
    )
    add.add_argument("--max-stored-mb", type=int, default=1024, help="artifacts kept, MiB (1024)")
    ls = ts.add_parser("list", help="the tenants and their quotas (never their keys)")
    ls.add_argument("--json", action="store_true")
    rm = ts.add_parser("remove", help="remove a tenant; its key stops working at once")
    rm.add_argument("name")
    rot = ts.add_parser(
        "rotate-key",
        help="a new API key; the old one stops working at once, and the sandboxes opened with "
        "it end",
    )
    rot.add_argument("name")
    sp = ts.add_parser(
        "set-profiles",
        help="replace the tenant's profiles; its held runs under one it loses can no longer be "
        "approved",
    )
    sp.add_argument("name")
    sp.add_argument(
        "--profile",
        action="append",
        required=True,
        help="a profile the tenant may use (repeat; the first is its default)",
    )
    aa = ts.add_parser(
        "add-approver",
        help="an approver key for the tenant: it approves and denies the tenant's held runs "
        "and tool calls (/v1/approvals, /ui), and runs nothing; prints it once",
    )
    aa.add_argument("name", help="the tenant")
    aa.add_argument("approver", help="a name for this approver (recorded with each decision)")
    ra = ts.add_parser("remove-approver", help="remove an approver key; it stops working at once")
    ra.add_argument("name", help="the tenant")
    ra.add_argument("approver")


def handle(args: argparse.Namespace) -> int:
    from sandcell.service.tenants import TenantStore

    home = args.home or data_dir()
    with TenantStore.in_home(home) as store:
        if args.tenants_command == "add":
            for name in args.profile:
                load_profile(name)  # an unknown profile is refused now, not at the first run
            if args.max_stored_mb <= 0:
                raise ConfigError("--max-stored-mb must be positive")
            tenant, key = store.add(
                args.name,
                profiles=args.profile,
                max_concurrent=args.max_concurrent,
                runs_per_minute=args.runs_per_minute,
                cpu_seconds_per_day=args.cpu_seconds_per_day,
                max_stored_bytes=args.max_stored_mb * MiB,
            )
            print(key)
            print(
                f"sandcell: tenant {tenant.name!r} added; this is its API key, shown only now "
                "(only its SHA-256 is stored): keep it",
                file=sys.stderr,
            )
            return 0
        if args.tenants_command == "list":
            tenants = store.list()
            if args.json:
                print(
                    json.dumps(
                        [{**t.to_dict(), "approvers": store.approvers(t.id)} for t in tenants]
                    )
                )
                return 0
            for t in tenants:
                print(
                    f"{t.name:<20} profiles={','.join(t.profiles)} "
                    f"concurrent={t.max_concurrent} per-minute={t.runs_per_minute} "
                    f"cpu-s/day={t.cpu_seconds_per_day} "
                    f"stored-mb={t.max_stored_bytes // MiB} "
                    f"approvers={','.join(store.approvers(t.id)) or '-'}"
                )
            return 0
        if args.tenants_command == "set-profiles":
            for name in args.profile:
                load_profile(name)  # an unknown profile is refused now, not at the first run
            tenant = store.set_profiles(args.name, args.profile)
            print(
                f"sandcell: tenant {tenant.name!r} now has profiles {', '.join(tenant.profiles)}",
                file=sys.stderr,
            )
            return 0
        if args.tenants_command == "add-approver":
            key = store.add_approver(args.name, args.approver)
            print(key)
            print(
                f"sandcell: approver {args.approver!r} of tenant {args.name!r} added; this is its "
                "key, shown only now: it approves the tenant's held runs and tool calls and "
                "runs nothing",
                file=sys.stderr,
            )
            return 0
        if args.tenants_command == "remove-approver":
            store.remove_approver(args.name, args.approver)
            print(
                f"sandcell: approver {args.approver!r} of tenant {args.name!r} removed",
                file=sys.stderr,
            )
            return 0
        if args.tenants_command == "remove":
            store.remove(args.name)
            print(f"sandcell: tenant {args.name!r} removed", file=sys.stderr)
            return 0
        key = store.rotate_key(args.name)
        print(key)
        print(
            f"sandcell: tenant {args.name!r} has a new API key, shown only now; the old one "
            "no longer works, and a running service ends the sandboxes opened with it",
            file=sys.stderr,
        )
        return 0
