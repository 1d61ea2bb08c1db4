#!/usr/bin/env python3
"""A real SMTP server for the mail tests (aiosmtpd from PyPI) on 127.0.0.1.

Each accepted message is written to DIR as <time>.eml (the bytes received) with <time>.json (the
envelope: mail_from, rcpt_tos, the login if any; the header names in order, the decoded
Subject and To, and the decoded text and HTML parts). A recipient whose address contains
"refused" gets 550. With --cert and --key it offers STARTTLS and requires it; with --login
USER:PASSWORD it requires that login (after STARTTLS). Prints "ready" once it listens.
"""
import argparse
import email
import email.policy
import json
import os
import signal
import ssl
import sys
import time

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Sink:
    def __init__(self, out):
        self.out = out

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if "refused" in address:
            return "550 5.1.1 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        # Names sort in arrival order, across restarts too.
        base = os.path.join(self.out, "%020d" % time.time_ns())
        meta = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "login": (
                session.auth_data.login.decode()
                if session.authenticated and session.auth_data is not None
                else None
            ),
            "tls": session.ssl is not None,
        }
        raw = envelope.original_content or envelope.content
        message = email.message_from_bytes(raw, policy=email.policy.default)
        meta["headers"] = list(message.keys())
        meta["subject"] = str(message.get("Subject", ""))
        meta["to"] = str(message.get("To", ""))
        for kind in ("plain", "html"):
            part = message.get_body(preferencelist=(kind,))
            meta[kind] = part.get_content() if part is not None else None
        with open(base + ".tmp", "wb") as f:
            f.write(raw)
        with open(base + ".json", "w") as f:
            json.dump(meta, f)
        os.rename(base + ".tmp", base + ".eml")
        return "250 Message accepted for delivery"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--login")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    kwargs = {}
    if a.cert:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(a.cert, a.key)
        kwargs.update(tls_context=ctx, require_starttls=True)
    if a.login:
        user, password = a.login.split(":", 1)

        def check(server, session, envelope, mechanism, auth_data):
            ok = (
                isinstance(auth_data, LoginPassword)
                and auth_data.login.decode() == user
                and auth_data.password.decode() == password
            )
            return AuthResult(success=ok, handled=False, auth_data=auth_data)

        kwargs.update(authenticator=check, auth_required=True, auth_require_tls=True)
    controller = Controller(
        Sink(a.dir), hostname="127.0.0.1", port=a.port, server_hostname="localhost", **kwargs
    )
    controller.start()
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        signal.pause()
    finally:
        controller.stop()


if __name__ == "__main__":
    sys.exit(main())
