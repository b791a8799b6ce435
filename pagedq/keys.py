"""``pagedq keys create|list|revoke``: API keys in the database the settings name (migrated first)."""

import argparse
import sys
from datetime import datetime

from core import keys
from core.db import make_db_engine, make_sessionmaker
from core.models import ApiKey
from core.settings import Settings
from pagedq.serve import migrate


def manage_keys(settings: Settings, action: str, args: argparse.Namespace) -> int:
    migrate(settings)
    engine = make_db_engine(settings)
    try:
        with make_sessionmaker(engine).begin() as session:
            if action == "create":
                try:
                    expires_in = keys.duration(args.expires_in) if args.expires_in else None
                    row, key = keys.create(session, args.name, args.admin, expires_in)
                except keys.KeyRefused as refused:
                    print(f"pagedq: {refused}", file=sys.stderr)
                    return 1
                print(f"{key}\n(key {row.id}, {row.role} {row.name!r}: shown once, store it now)")
            elif action == "list":
                for row in keys.listed(session):
                    print(_line(row))
            else:
                row = keys.revoke(session, args.key)
                if row is None:
                    print(f"pagedq: no key is named or numbered {args.key!r}", file=sys.stderr)
                    return 1
                print(f"revoked {_line(row)}")
    finally:
        engine.dispose()
    return 0


def _line(row: ApiKey) -> str:
    state = (
        "revoked" if row.revoked_at else "expires " + _when(row.expires_at) if row.expires_at else "active"
    )
    used = _when(row.last_used_at) if row.last_used_at else "never"
    created = _when(row.created_at)
    return f"{row.id}  {row.name}  {row.prefix}…  {row.role}  {state}  created {created}  used {used}"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "-"
