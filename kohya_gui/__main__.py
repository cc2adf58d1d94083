"""``python -m kohya_gui`` / ``kohya-gui``: start the web UI.

It listens on 127.0.0.1 unless told otherwise. Listening on any other address exposes training
jobs and the output folder to the network, so that needs a username and a password.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
PASSWORD_ENV = "KOHYA_GUI_PASSWORD"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kohya-gui", description="Kohya Studio web UI")
    parser.add_argument("--listen", default="127.0.0.1", metavar="ADDR",
                        help="address to listen on (default 127.0.0.1; anything else needs "
                             "--username and --password)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--inbrowser", action="store_true", help="open the page in a browser")
    parser.add_argument("--username", help="login name")
    parser.add_argument("--password", help=f"login password (or set ${PASSWORD_ENV})")
    return parser.parse_args(argv)


def is_loopback(addr: str) -> bool:
    addr = addr.strip().strip("[]")
    if addr.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def check_access(args: argparse.Namespace) -> tuple[tuple[str, str] | None, str | None]:
    """(auth, None) when the settings are safe, else (None, why not)."""
    password = args.password or os.environ.get(PASSWORD_ENV) or None
    if bool(args.username) != bool(password):
        return None, "give both --username and --password (or neither)"
    auth = (args.username, password) if args.username else None
    if auth is None and not is_loopback(args.listen):
        return None, (
            f"refusing to listen on {args.listen} without a login: anyone who can reach this "
            "machine could start training jobs and read the output folder. Add --username and "
            f"--password (or ${PASSWORD_ENV}), or listen on 127.0.0.1.")
    if not 0 < args.port < 65536:
        return None, f"--port {args.port}: use a port between 1 and 65535"
    return auth, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    auth, problem = check_access(args)
    if problem:
        print(f"kohya-gui: {problem}", file=sys.stderr)
        return 2
    from kohya_gui.app import build_app, launch

    demo = build_app()
    launch(demo, listen=args.listen, port=args.port, auth=auth, inbrowser=args.inbrowser)
    return 0


if __name__ == "__main__":
    sys.exit(main())
