"""``python -m kohya_gui`` / ``kohya-gui``: start the web UI.

It listens on 127.0.0.1 unless told otherwise. Listening on any other address exposes training
jobs and the output folder to the network, so that needs a username and a password. The
credentials can come from the environment (``KOHYA_GUI_USERNAME``, ``KOHYA_GUI_PASSWORD``) or a
file (``--auth-file``: one ``user:password`` line) instead of the command line, where ``ps``
shows them to every user of the machine.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
PASSWORD_ENV = "KOHYA_GUI_PASSWORD"
USERNAME_ENV = "KOHYA_GUI_USERNAME"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kohya-gui", description="Kohya Studio web UI")
    parser.add_argument("--listen", default="127.0.0.1", metavar="ADDR",
                        help="address to listen on (default 127.0.0.1; anything else needs "
                             "--username and --password)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--inbrowser", action="store_true", help="open the page in a browser")
    parser.add_argument("--username", help=f"login name (or set ${USERNAME_ENV})")
    parser.add_argument("--password", help=f"login password (visible in `ps`: prefer "
                                           f"${PASSWORD_ENV} or --auth-file)")
    parser.add_argument("--auth-file", metavar="FILE",
                        help="a file holding one line 'username:password' (keep it chmod 600)")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="another name this server may be reached by (a Host header "
                             "other than localhost, 127.0.0.1, [::1] and --listen is refused; "
                             "repeatable)")
    return parser.parse_args(argv)


def read_auth_file(path: str) -> tuple[str | None, str | None, str | None]:
    """(username, password, None) from an --auth-file, or (None, None, why not)."""
    try:
        text = open(path, encoding="utf-8").read(4096)
    except (OSError, UnicodeDecodeError) as exc:
        return None, None, f"--auth-file {path}: cannot read it ({exc})"
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    user, sep, password = line.partition(":")
    if not sep or not user.strip() or not password:
        return None, None, f"--auth-file {path}: write one line 'username:password'"
    return user.strip(), password, None


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
    username = args.username or os.environ.get(USERNAME_ENV) or None
    password = args.password or os.environ.get(PASSWORD_ENV) or None
    if getattr(args, "auth_file", None):
        if args.username or args.password:
            return None, "give the login either in --auth-file or as --username/--password"
        username, password, problem = read_auth_file(args.auth_file)
        if problem:
            return None, problem
    if bool(username) != bool(password):
        return None, "give both --username and --password (or neither)"
    auth = (username, password) if username else None
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
    if args.password:
        print(f"kohya-gui: the password on the command line is visible to every user of this "
              f"machine (ps); prefer ${PASSWORD_ENV} or --auth-file", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from kohya_gui.app import build_app, launch
    from kohya_gui.history import HistoryLocked

    try:
        demo = build_app()
    except HistoryLocked as exc:
        print(f"kohya-gui: {exc}", file=sys.stderr)
        return 2
    launch(demo, listen=args.listen, port=args.port, auth=auth, inbrowser=args.inbrowser,
           allowed_hosts=tuple(args.allowed_host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
