"""Rows read and written as plain statements, several to a round trip.

The ledger's hot path (an intent, a receipt) is a few reads under the key's lock and a few
writes before the commit. Through the ORM each is its own round trip and its own SQL
compilation; here each table's statements are written once per process, and on PostgreSQL
a `Batch` of them is sent as one pipeline (`durability.pipeline`): one round trip for the
reads, one for the writes and the COMMIT. On SQLite the same statements run one after the
other.

Values pass through the model fields' own conversions both ways (`get_db_prep_save`, the
backend's and the field's converters), so a row read here is the instance the ORM would
have built, and a row written here is the one `save()` would have written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import signals

from durability import pipeline


def _quoted(name: str | None) -> str:
    assert name is not None
    return connection.ops.quote_name(name)


@cache
def columns(model: type[models.Model]) -> tuple[models.Field[Any, Any], ...]:
    return tuple(model._meta.concrete_fields)


@cache
def names_sql(model: type[models.Model], alias: str = "") -> str:
    """Every column of `model`, in `hydrate`'s order, as a select list."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + _quoted(f.column) for f in columns(model))


@cache
def select_sql(model: type[models.Model], alias: str = "") -> str:
    """`SELECT <every column> FROM <table> [alias]`, the caller adds the rest."""
    table = _quoted(model._meta.db_table)
    return f"SELECT {names_sql(model, alias)} FROM {table}" + (f" {alias}" if alias else "")


@cache
def _converters(model: type[models.Model]) -> tuple[tuple[Any, list[Any]], ...]:
    table = model._meta.db_table
    out = []
    for f in columns(model):
        column = f.get_col(table)
        out.append(
            (column, connection.ops.get_db_converters(column) + f.get_db_converters(connection))
        )
    return tuple(out)


def _db() -> Any:
    """The default connection itself: the `connection` proxy looks it up on every use."""
    return connections[DEFAULT_DB_ALIAS]


@cache
def _attnames(model: type[models.Model]) -> list[str]:
    return [f.attname for f in columns(model)]


@cache
def _built_plainly(model: type[models.Model]) -> bool:
    """Whether `model`'s instances can be built without `Model.__init__`: nothing listens to
    its init signals, and neither its construction nor `from_db` is its own."""
    return not (
        signals.pre_init.has_listeners(model)
        or signals.post_init.has_listeners(model)
        or model.__init__ is not models.Model.__init__
        or model.from_db.__func__ is not models.Model.from_db.__func__  # type: ignore[attr-defined]
    )


def hydrate[M: models.Model](model: type[M], row: Sequence[Any]) -> M:
    """The instance of a row read with `select_sql(model)`: the one `Model.from_db` builds,
    built without `__init__`'s per-field descriptor calls where nothing depends on them."""
    db = _db()
    values = []
    for value, (column, converters) in zip(row, _converters(model), strict=True):
        for converter in converters:
            value = converter(value, column, db)
        values.append(value)
    if not _built_plainly(model):
        return model.from_db(DEFAULT_DB_ALIAS, _attnames(model), values)
    obj = model.__new__(model)
    obj.__dict__.update(zip(_attnames(model), values, strict=True))
    state = obj._state = models.base.ModelState()
    state.adding, state.db = False, DEFAULT_DB_ALIAS
    return obj


@cache
def _init_fields(
    model: type[models.Model],
) -> tuple[tuple[models.Field[Any, Any], bool, Callable[[], Any]], ...]:
    """The fields `Model.__init__` sets, each with whether it is a relation (which may be
    given as an object, by its name) and what gives its default: the callable that a plain
    `Field.get_default` would call (`_get_default`, which Django computes once per field),
    without that method's frame on every new row; a field class with its own `get_default`
    (a ForeignKey's, say) keeps it."""
    return tuple(
        (
            f,
            isinstance(f.remote_field, models.ForeignObjectRel),
            f._get_default  # type: ignore[attr-defined]
            if type(f).get_default is models.Field.get_default
            else f.get_default,
        )
        for f in model._meta.fields
        if f.column is not None and not f.generated
    )


_UNSET = object()


def new[M: models.Model](model: type[M], **values: Any) -> M:
    """`model(**values)`, a new instance to be saved: each field the value given (a relation
    by its object, through its descriptor as `__init__` sets it, or by its key), else its
    default; `pk` by that name. Built without `Model.__init__` where nothing depends on it
    (`_built_plainly`): that spends more on a wide model's keywords (an exception caught
    for each field left to its default) than on anything else of the instance."""
    if not _built_plainly(model):
        return model(**values)
    obj = model.__new__(model)
    obj._state = models.base.ModelState()
    pk = values.pop("pk", _UNSET)
    for f, relation, default in _init_fields(model):
        if relation and f.name in values:
            setattr(obj, f.name, values.pop(f.name))
        else:
            value = values.pop(f.attname, _UNSET)
            setattr(obj, f.attname, default() if value is _UNSET else value)
    if pk is not _UNSET:
        obj.pk = pk
    if values:
        raise TypeError(f"{model.__name__}() got unexpected keyword arguments: {list(values)}")
    return obj


def next_id_sql(model: type[models.Model]) -> str:
    """A statement answering a fresh primary key for `model`, to be followed by a
    condition (`WHERE NOT EXISTS (...)`) so that a key is drawn only when it is needed."""
    return f"SELECT {next_id(model)}"


def next_id(model: type[models.Model]) -> str:
    """An expression drawing a fresh primary key for `model` (`next_id_sql`'s), to be
    evaluated only when the key is needed (in a `CASE`, say).

    PostgreSQL draws from the column's sequence. SQLite runs one writer at a time (the
    settings' IMMEDIATE transactions), so the next key after the table's AUTOINCREMENT
    high-water mark is the writer's alone.
    """
    table = model._meta.db_table
    pk = model._meta.pk.column
    if connection.vendor == "postgresql":
        return f"nextval(pg_get_serial_sequence('{table}', '{pk}'))"
    return (
        "MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = "
        f"'{table}'), 0), COALESCE((SELECT MAX({_quoted(pk)}) FROM {_quoted(table)}), 0)) + 1"
    )


# -- batches -------------------------------------------------------------------------------


@dataclass
class Result:
    """The rows one statement of a batch answered, once the batch has run."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def one(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None


class Stale(Exception):
    """The statement sent `ahead` of a request's reads found what a cache answered stale."""


@dataclass
class _Ahead:
    sql: str
    params: Sequence[Any]
    holds: Callable[[Result], bool]


_ahead: ContextVar[_Ahead | None] = ContextVar("rows_ahead", default=None)


@contextmanager
def ahead(sql: str, params: Sequence[Any], holds: Callable[[Result], bool]) -> Iterator[None]:
    """Send `sql` before any other statement of the block: in the same round trip as the
    block's first `Batch`, or on its own before the first statement that is not one.
    When `holds` says its answer does not hold, `Stale` is raised before anything the
    block writes is sent (the batch's reads share its transaction, which rolls back), so
    the caller may look again and run the block afresh.

    A cache (the API keys') is validated this way without a round trip of its own.
    """
    token = _ahead.set(_Ahead(sql, params, holds))

    def first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        _check_ahead()
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(first):
            yield
    finally:
        _ahead.reset(token)


def _check_ahead() -> None:
    pending = _ahead.get()
    if pending is None:
        return
    _ahead.set(None)
    result = Result()
    with connection.cursor() as cursor:
        cursor.execute(pending.sql, pending.params)
        result.rows = list(cursor.fetchall())
    if not pending.holds(result):
        raise Stale(pending.sql)


# The block's transaction is open in Django but its BEGIN not yet sent (`begun_lazily`).
_begin: ContextVar[bool] = ContextVar("rows_begin", default=False)


@contextmanager
def begun_lazily() -> Iterator[None]:
    """Inside an outermost `transaction.atomic()` on PostgreSQL, before any statement: the
    transaction's BEGIN goes with the block's first statement (in its pipeline, where it is
    a `Batch`'s or the `Writes`'), not in a round trip of its own.

    psycopg sends the BEGIN itself before the first statement of a transaction, and in
    pipeline mode waits for its answer before the statements queued after it. Here psycopg
    is left in autocommit, which sends no BEGIN, and the block sends its own ahead of its
    first statement; Django's commit or rollback at the block's end closes the transaction
    as ever (psycopg commits and rolls back whatever its autocommit), and Django puts
    autocommit back after it. Nothing sent, nothing begun: the transaction stays empty.
    """
    db = _db()
    if db.vendor != "postgresql":
        yield
        return
    assert db.in_atomic_block and db.connection.info.transaction_status == pipeline.IDLE
    db.connection.autocommit = True
    token = _begin.set(True)

    def first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        _begin_sent(db)
        return execute(sql, params, many, context)

    try:
        with db.execute_wrapper(first):
            yield
    finally:
        _begin.reset(token)


def _begin_sent(db: Any) -> None:
    """Send the BEGIN `begun_lazily` holds back: queued, inside a pipeline (its answer, a
    command's, is read at the sync with the rest); before the first statement otherwise."""
    if not _begin.get():
        return
    _begin.set(False)
    with db.wrap_database_errors:
        db.connection.execute(pipeline.begin_command(db.connection), prepare=False)


@dataclass
class _Queued:
    sql: str
    params: Sequence[Any]
    result: Result
    carrier: bool  # one row, no FROM: the statement sent `ahead` may ride in it
    carried: bool = False  # its first column is the answer of the statement `ahead`


@dataclass
class Batch:
    """SELECTs sent together, answered together: on PostgreSQL one pipeline, one round
    trip; on SQLite one after the other."""

    queued: list[_Queued] = field(default_factory=list)

    def add(self, sql: str, params: Sequence[Any] = (), *, carrier: bool = False) -> Result:
        """Queue `sql`. A `carrier` is a `SELECT` of expressions with no FROM, answering one
        row: sent first, it carries the statement sent `ahead` (a scalar subquery) as its
        first column, which saves that statement its own execution."""
        result = Result()
        self.queued.append(_Queued(sql, params, result, carrier))
        return result

    def run(self) -> None:
        """Send the batch (after the statement sent `ahead`, if any) and read its answers."""
        pending = _ahead.get()
        first = Result()
        if pending is not None:
            _ahead.set(None)
            if self.queued and self.queued[0].carrier:
                head = self.queued[0]
                head.sql = f"SELECT ({pending.sql}), {head.sql.removeprefix('SELECT ')}"
                head.params = [*pending.params, *head.params]
                head.carried = True
            else:
                self.queued.insert(0, _Queued(pending.sql, pending.params, first, False))
        db = _db()
        if db.vendor == "postgresql":
            statements = [pipeline.Statement(q.sql, q.params) for q in self.queued]
            _sent(db, statements)
            answers = [statement.rows for statement in statements]
        else:
            answers = []
            with db.cursor() as cursor:
                for queued in self.queued:
                    cursor.execute(queued.sql, queued.params)
                    answers.append(list(cursor.fetchall()))
        for queued, found in zip(self.queued, answers, strict=True):
            if queued.carried:
                first.rows = [row[:1] for row in found]
                found = [row[1:] for row in found]
            queued.result.rows = found
        self.queued = []
        if pending is not None and not pending.holds(first):
            raise Stale(pending.sql)


def send(statements: Sequence[pipeline.Statement], *, commit: bool = False) -> None:
    """Send `statements` together, in the transaction begun (if any), and put each one's rows
    in its `rows`: on PostgreSQL as one pipeline, one round trip (`durability.pipeline`,
    after the BEGIN psycopg or `begun_lazily` would send); on SQLite one after the other.
    Errors are raised as Django's; on PostgreSQL, the first one met, once every answer is
    read (the statements after it did not run). The connection's execute wrappers
    (`connection.execute_wrapper`) see each statement as it is queued, as they would see it
    executed.

    `commit`: the caller's outermost `transaction.atomic()` ends with these statements; on
    PostgreSQL its COMMIT goes in their round trip (Django's commit at the block's end then
    finds the transaction closed, and sends nothing); on SQLite Django's commit does it."""
    db = _db()
    if db.vendor == "postgresql":
        assert not commit or len(db.atomic_blocks) == 1, "commit: in the outermost block only"
        db.ensure_connection()
        _sent(db, [statement for statement in statements if _wrapped(db, statement)], commit=commit)
        return
    with db.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement.sql, statement.params)
            statement.rows = list(cursor.fetchall()) if cursor.description else []


def _wrapped(db: Any, statement: pipeline.Statement) -> bool:
    """Pass `statement` through the connection's execute wrappers, as Django's cursor does;
    whether the last of them queued it (with the text and parameters it was given)."""
    queued = False

    def queue(sql: str, params: Any, many: bool, context: Any) -> None:
        nonlocal queued
        queued = True
        statement.sql, statement.params = sql, params

    executor: Callable[..., Any] = queue
    for wrapper in reversed(db.execute_wrappers):
        executor = functools.partial(wrapper, executor)
    executor(statement.sql, statement.params, False, {"connection": db, "cursor": None})
    return queued


def _sent(db: Any, statements: list[pipeline.Statement], *, commit: bool = False) -> None:
    """Send `statements` as one pipeline (`durability.pipeline`) on the default connection,
    after the BEGIN `begun_lazily` holds back, if it is still held, and before a COMMIT
    (`commit`); logged as Django logs its own statements when it logs queries (DEBUG, or a
    test capturing them), errors raised as Django's."""
    db.validate_no_broken_transaction()
    begin = _begin.get()
    _begin.set(False)
    with db.wrap_database_errors:
        pipeline.send(db.connection, statements, begin=begin, commit=commit)
    if db.queries_logged:
        with psycopg.ClientCursor(db.connection) as literal:
            for statement in statements:
                sql = literal.mogrify(statement.sql, statement.params)
                db.queries_log.append({"sql": sql, "time": "0.000"})
        if commit:
            db.queries_log.append({"sql": "COMMIT", "time": "0.000"})


# -- writes --------------------------------------------------------------------------------


@cache
def _insert_sql(
    model: type[models.Model], with_pk: bool
) -> tuple[str, tuple[models.Field[Any, Any], ...]]:
    fields = tuple(f for f in columns(model) if with_pk or not f.primary_key)
    names = ", ".join(_quoted(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {_quoted(model._meta.db_table)} ({names}) VALUES ({marks})"
    if not with_pk:
        sql += f" RETURNING {_quoted(model._meta.pk.column)}"
    return sql, fields


@cache
def _update_sql(model: type[models.Model], names: frozenset[str]) -> tuple[str, tuple[Any, ...]]:
    fields = tuple(f for f in columns(model) if f.name in names or f.attname in names)
    sets = ", ".join(f"{_quoted(f.column)} = %s" for f in fields)
    pk = _quoted(model._meta.pk.column)
    return f"UPDATE {_quoted(model._meta.db_table)} SET {sets} WHERE {pk} = %s", fields


# Writes sent as one statement at most (data-modifying CTEs): the staged writes of a request
# are a handful; a bulk action's hundreds go in statements of this many.
WRITES_PER_STATEMENT = 8


@dataclass
class Writes:
    """Rows to insert or update at the end of a transaction, each written once with its
    final values; statements go in the order their first row was staged, but the parts of
    one statement run in no set order.

    On PostgreSQL the writes go as few statements: each a `WITH` of up to
    WRITES_PER_STATEMENT inserts and updates (data-modifying CTEs), answering the keys the
    database drew. Its
    parts see one snapshot and none of each other's rows, which no write here needs (each
    row is written once; foreign keys are checked at the statement's end); a row written
    twice (two instances of it) starts a new statement. A unique index that is not deferred
    (`case_one_open_per_effect_reason`) is checked row by row in that unknown order: a path
    that closes an effect's open case and opens another of the same reason must not stage
    both for one statement (none does today; the ledger adds to the open case instead). On
    SQLite each write is a statement of its own.
    """

    staged: dict[int, tuple[models.Model, set[str] | None]] = field(default_factory=dict)

    def stage(self, obj: models.Model, *fields: str) -> None:
        """Insert `obj` (if it was never saved) or update the named fields of its row."""
        held = self.staged.get(id(obj))
        if obj._state.adding:
            self.staged[id(obj)] = (obj, None)
        elif held is None:
            self.staged[id(obj)] = (obj, set(fields))
        elif held[1] is not None:
            held[1].update(fields)

    def send(self, *, commit: bool = False) -> None:
        """Write every staged row, and give the new rows the keys the database drew: on
        PostgreSQL as one pipeline, with the COMMIT after them if `commit` (the caller's
        transaction, which it then finds closed); on SQLite one statement after another."""
        _check_ahead()  # past Django's cursor, where `ahead`'s execute wrapper would
        group: list[_Write] = []
        rows: set[tuple[str, Any]] = set()
        statements: list[tuple[pipeline.Statement, list[models.Model]]] = []
        db = _db()
        merge = WRITES_PER_STATEMENT if db.vendor == "postgresql" else 1
        for obj, names in self.staged.values():
            write = _write(db, obj, names)
            if write is None:
                continue
            if group and (len(group) == merge or (write.row is not None and write.row in rows)):
                statements.append(_statement(group))
                group, rows = [], set()
            group.append(write)
            if write.row is not None:
                rows.add(write.row)
        if group:
            statements.append(_statement(group))
        self.staged = {}
        if db.vendor != "postgresql":
            with db.cursor() as cursor:
                for statement, drawn in statements:
                    cursor.execute(statement.sql, statement.params)
                    statement.rows = list(cursor.fetchall()) if drawn else []
        elif statements or (commit and not _begin.get()):
            _sent(db, [statement for statement, _ in statements], commit=commit)
        for statement, drawn in statements:
            if drawn:
                for obj, pk in zip(drawn, statement.rows[0], strict=True):
                    obj.pk = pk


@dataclass
class _Write:
    sql: str
    params: list[Any]
    drawn: models.Model | None  # the row whose key the database draws (RETURNING it)
    row: tuple[str, Any] | None  # (table, key) of a row whose key is known


def _write(db: Any, obj: models.Model, names: set[str] | None) -> _Write | None:
    obj._prepare_related_fields_for_save(operation_name="save")  # type: ignore[attr-defined]
    table = obj._meta.db_table
    if names is None:
        sql, fields = _insert_sql(type(obj), obj.pk is not None)
        params = [_value(db, obj, f, add=True) for f in fields]
        obj._state.adding = False
        if obj.pk is None:
            return _Write(sql, params, obj, None)
        return _Write(sql, params, None, (table, obj.pk))
    if names:
        sql, fields = _update_sql(type(obj), frozenset(names))
        params = [*(_value(db, obj, f, add=False) for f in fields), obj.pk]
        return _Write(sql, params, None, (table, obj.pk))
    return None


def _statement(group: list[_Write]) -> tuple[pipeline.Statement, list[models.Model]]:
    """The writes of `group` as one statement, and the rows whose keys it answers (in the
    order of its answer's columns)."""
    if len(group) == 1:
        (write,) = group
        return pipeline.Statement(write.sql, write.params), [write.drawn] if write.drawn else []
    parts = ", ".join(f"w{n} AS ({write.sql})" for n, write in enumerate(group))
    keys = [
        (f"(SELECT {_quoted(write.drawn._meta.pk.column)} FROM w{n})", write.drawn)
        for n, write in enumerate(group)
        if write.drawn is not None
    ]
    answer = ", ".join(sql for sql, _ in keys) or "1"
    params = [value for write in group for value in write.params]
    return pipeline.Statement(f"WITH {parts} SELECT {answer}", params), [d for _, d in keys]


def _value(db: Any, obj: models.Model, f: models.Field[Any, Any], *, add: bool) -> Any:
    if type(f) in _HELD_TYPES:
        return getattr(obj, f.attname)
    if _time_held(f, db.vendor):
        value = getattr(obj, f.attname)
        if value is None or (isinstance(value, datetime) and value.utcoffset() is not None):
            return value
    return f.get_db_prep_save(f.pre_save(obj, add), db)


@cache
def _time_held(f: models.Field[Any, Any], vendor: str) -> bool:
    """Whether `f`'s value is stored as it is held when it is None or an aware datetime: a
    DateTimeField (exactly) that is not set on save (`auto_now`), on PostgreSQL, whose
    adaptation of a datetime is the identity. A naive one still goes through the field's
    conversion, which warns and makes it aware."""
    return (
        type(f) is models.DateTimeField
        and not (f.auto_now or f.auto_now_add)
        and vendor == "postgresql"
    )


# Fields whose value is stored as it is held (their `pre_save` and `get_db_prep_save` change
# nothing for a value of their own type; exact types, so no subclass with its own conversion
# is taken for one): read straight from the instance.
_HELD_TYPES = frozenset(
    {
        models.AutoField,
        models.BigAutoField,
        models.BooleanField,
        models.CharField,
        models.IntegerField,
        models.BigIntegerField,
        models.PositiveIntegerField,
        models.PositiveBigIntegerField,
        models.PositiveSmallIntegerField,
        models.TextField,
        models.ForeignKey,
    }
)
