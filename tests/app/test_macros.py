"""The reply library in the dashboard: supervisors add, edit and delete macros through the pages
(plain forms), every change audited and written to the file the pipeline reads; real database
(SQLite; PostgreSQL too), real app under TestClient, the real library file."""

from __future__ import annotations

import html
import re
import shutil

import pytest
from tests.support.app import DATABASE_PARAMS, dashboard_settings, sign_in, staffed_database
from fastapi.testclient import TestClient

from app.crud import macros
from app.db import Database
from app.main import create_app
from app.models import Macro
from chatlens.contracts import MAX_MACRO_BODY_CHARS, ReplyLibrary
from chatlens.replies import DEFAULT_LIBRARY, read_library


@pytest.fixture(params=DATABASE_PARAMS)
def staffed(request, tmp_path):
    return staffed_database(request.param, tmp_path)


@pytest.fixture
def export(tmp_path):
    return tmp_path / "exported" / "reply-library.json"  # its folder does not exist yet


@pytest.fixture
def app(staffed, export):
    return create_app(dashboard_settings(staffed[0], reply_library=str(export)))


@pytest.fixture
def sam(app, staffed):
    with TestClient(app) as client:
        yield sign_in(client, staffed[1], "sam")


@pytest.fixture
def alice(app, staffed):
    return sign_in(TestClient(app), staffed[1], "alice")  # the app is already started by `sam`


def post_form(client, url: str, **fields: str):
    """A plain HTML form post, as a browser without JavaScript sends it: the token in the form only."""
    return client.post(url, data={"csrf_token": client.headers["X-CSRF-Token"], **fields},
                       headers={"X-CSRF-Token": ""}, follow_redirects=False)


def shown(page_html: str) -> list[tuple[str, str, str]]:
    """(title, language, text) of every macro the page lists, in its order."""
    found = re.findall(r'<li class="card macro" id="macro-\d+">\s*<div class="macro-head">\s*<h2>(.*?)</h2>\s*'
                       r'<span class="tag">(.*?)</span>.*?<p class="macro-body">(.*?)</p>', page_html, re.DOTALL)
    return [tuple(html.unescape(part) for part in row) for row in found]


def in_file(path) -> list[tuple[str, str, str]]:
    return [(m.title, m.language, m.body) for m in read_library(path).macros]


def macro_ids(database_url: str) -> list[int]:
    db = Database(database_url)
    try:
        with db.read() as session:
            return [macro.id for macro in session.query(Macro).order_by(Macro.position, Macro.id)]
    finally:
        db.dispose()


def audit(client, action: str) -> list[dict]:
    response = client.get("/api/audit", params={"action": action})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_migration_seeded_the_default_library_and_the_start_wrote_it(sam, export):
    default = read_library(DEFAULT_LIBRARY)
    assert default.macros, "the shipped library is empty"
    exported = sam.get("/api/reply-library")
    assert exported.status_code == 200 and exported.headers["cache-control"] == "no-store"
    assert ReplyLibrary.model_validate_json(exported.text) == default  # every macro, in file order
    assert read_library(export) == default  # written at start, before any change
    page = sam.get("/macros")
    assert page.status_code == 200
    assert shown(page.text) == [(m.title, m.language, m.body) for m in default.macros]
    assert page.text.count("As shipped with ChatLens") == len(default.macros)
    assert "<code>{reference}</code> in a text stands for the order" in page.text
    assert f"<code>{export}</code>" in page.text
    assert '<a href="/macros" aria-current="page">Reply library</a>' in page.text
    assert audit(sam, "macro_created") == []


def test_supervisors_add_edit_and_delete_macros_audited_and_exported(sam, staffed, export):
    before = in_file(export)
    assert "eo" not in {language for _, language, _ in before}  # a language of its own, whatever ships

    # Add: a plain form post, then back to the page at the new macro.
    added = post_form(sam, "/macros", title="Malfrua livero", language="eo", keywords="malfrua  prokrasto\nlivero",
                      body="Pardonon, ke {reference} ankoraŭ mankas.\r\nMi kontrolas ĝin.")
    assert added.status_code == 303, added.text
    new_id = macro_ids(staffed[0])[-1]
    assert added.headers["location"] == f"/macros?done=added#macro-{new_id}"
    page = sam.get(added.headers["location"])
    assert '<p class="flash ok" role="status">Macro added.</p>' in page.text
    assert shown(page.text)[-1] == ("Malfrua livero", "eo",
                                    "Pardonon, ke {reference} ankoraŭ mankas.\nMi kontrolas ĝin.")  # \r\n: \n
    assert in_file(export) == shown(page.text) == [*before, shown(page.text)[-1]]
    assert read_library(export).macros[-1].keywords == "malfrua prokrasto livero"
    created = audit(sam, "macro_created")
    assert len(created) == 1 and created[0]["actor"] == "sam" and created[0]["before"] is None
    assert created[0]["after"]["macro_id"] == new_id and created[0]["after"]["language"] == "eo"

    # The language filter offers the languages present and lists only the one picked.
    languages = re.findall(r'<option value="([^"]+)"', page.text.split("</select>")[0])
    assert sorted(languages) == sorted({m[1] for m in before} | {"eo"})
    esperanto = sam.get("/macros", params={"language": "eo"})
    assert [m[0] for m in shown(esperanto.text)] == ["Malfrua livero"]
    assert len(shown(sam.get("/macros", params={"language": "xx"}).text)) == len(before) + 1  # unknown: all

    # Edit the first macro: its text becomes markup-looking words, shown as text, kept as typed.
    first = macro_ids(staffed[0])[0]
    body = 'Sorry about {reference} <b>really</b> & "truly". I\'m on it.'
    saved = post_form(sam, f"/macros/{first}", title=before[0][0], language=before[0][1],
                      keywords="late", body=body, shown="eo")
    assert saved.status_code == 303 and saved.headers["location"] == f"/macros?done=saved#macro-{first}"
    page = sam.get("/macros")
    assert shown(page.text)[0] == (before[0][0], before[0][1], body)
    assert "<b>really</b>" not in page.text and "&lt;b&gt;really&lt;/b&gt; &amp; &#34;truly&#34;" in page.text
    assert in_file(export) == shown(page.text)
    assert "Edited by sam" in page.text
    updated = audit(sam, "macro_updated")
    assert len(updated) == 1 and updated[0]["actor"] == "sam"
    assert updated[0]["before"]["body"] == before[0][2] and updated[0]["after"]["body"] == body
    assert updated[0]["before"]["keywords"] != "late" and updated[0]["after"]["keywords"] == "late"
    # Saving it unchanged changes nothing and records nothing.
    assert post_form(sam, f"/macros/{first}", title=before[0][0], language=before[0][1],
                     keywords="late", body=body).status_code == 303
    assert len(audit(sam, "macro_updated")) == 1

    # Delete the Esperanto one: gone from the page, the file and the filter; the audit keeps it.
    deleted = post_form(sam, f"/macros/{new_id}/delete", shown="eo")
    assert deleted.status_code == 303 and deleted.headers["location"] == "/macros?language=eo&done=deleted"
    page = sam.get(deleted.headers["location"])
    assert '<p class="flash ok" role="status">Macro deleted.</p>' in page.text
    assert in_file(export) == shown(page.text) == [(before[0][0], before[0][1], body), *before[1:]]
    assert 'value="eo"' not in page.text
    removed = audit(sam, "macro_deleted")
    assert len(removed) == 1 and removed[0]["after"] is None
    assert removed[0]["before"] == created[0]["after"]
    assert post_form(sam, f"/macros/{new_id}/delete").status_code == 404

    # The JSON export is the file, and the audit page names the macros changed.
    assert ReplyLibrary.model_validate_json(sam.get("/api/reply-library").text) == read_library(export)
    audit_page = sam.get("/audit").text
    assert f'<a href="/macros#macro-{first}">Macro {first}</a>' in audit_page
    assert "macro_deleted" in audit_page and "Malfrua livero" in audit_page


@pytest.mark.parametrize("fields, message", [
    ({"title": "   "}, "The title is empty."),
    ({"body": " \r\n "}, "The text is empty."),
    ({"language": "English"}, "The language &#39;English&#39; is not a language tag"),
    ({"language": ""}, "The language is empty."),
    ({"body": "x" * (MAX_MACRO_BODY_CHARS + 1)},
     f"The text is {MAX_MACRO_BODY_CHARS + 1:,} characters long; at most {MAX_MACRO_BODY_CHARS:,} are allowed."),
])
def test_invalid_macros_are_refused_with_a_message_and_nothing_changes(sam, staffed, export, fields, message):
    library, file_bytes = sam.get("/api/reply-library").json(), export.read_bytes()
    good = {"title": "Refund", "language": "en", "keywords": "refund", "body": "I'm on it: <refund>."}
    first = macro_ids(staffed[0])[0]
    for url, key in (("/macros", "new"), (f"/macros/{first}", str(first))):
        refused = post_form(sam, url, **(good | fields))
        assert refused.status_code == 422, refused.text
        assert "text/html" in refused.headers["content-type"]
        assert f'<p class="flash error" role="alert">{message}' in refused.text
        # the form comes back open with what was typed, escaped
        assert refused.text.count(" open>") == 1
        assert f'id="title-{key}" name="title" value="{fields.get("title", "Refund")}"' in refused.text
        if "body" not in fields:
            assert "I&#39;m on it: &lt;refund&gt;.</textarea>" in refused.text
    assert sam.get("/api/reply-library").json() == library
    assert export.read_bytes() == file_bytes
    assert audit(sam, "macro_created") == audit(sam, "macro_updated") == []


def test_agents_get_403_on_the_library_page_and_api(sam, alice, staffed, export):
    library, file_bytes = sam.get("/api/reply-library").json(), export.read_bytes()
    first = macro_ids(staffed[0])[0]
    assert alice.get("/macros").status_code == 403
    assert "This page is for supervisors." in alice.get("/macros").text
    assert alice.get("/api/reply-library").status_code == 403
    for url in ("/macros", f"/macros/{first}", f"/macros/{first}/delete"):
        refused = post_form(alice, url, title="Mine", language="en", body="Agents write this.")
        assert refused.status_code == 403, url
    assert 'href="/macros"' not in alice.get("/").text  # not in the agents' navigation
    assert sam.get("/api/reply-library").json() == library and export.read_bytes() == file_bytes
    assert audit(sam, "macro_deleted") == []
    # nor without a login
    anonymous = TestClient(alice.app)
    assert anonymous.get("/api/reply-library").status_code == 401
    assert anonymous.get("/macros", follow_redirects=False).headers["location"] == "/login?next=/macros"


def test_changes_without_the_csrf_token_are_refused(sam, staffed, export):
    library, file_bytes = sam.get("/api/reply-library").json(), export.read_bytes()
    first = macro_ids(staffed[0])[0]
    for url in ("/macros", f"/macros/{first}", f"/macros/{first}/delete"):
        for token in ("", "wrong"):
            refused = sam.post(url, data={"csrf_token": token, "title": "T", "language": "en", "body": "B"},
                               headers={"X-CSRF-Token": ""}, follow_redirects=False)
            assert refused.status_code == 403, (url, token)
    assert sam.get("/api/reply-library").json() == library and export.read_bytes() == file_bytes


def test_a_library_file_that_cannot_be_written_is_reported_and_written_by_the_next_change(sam, staffed, export):
    first = macro_ids(staffed[0])[0]
    shutil.rmtree(export.parent)
    export.parent.write_text("not a folder")  # the file's folder is in the way now
    kept = sam.get("/api/reply-library").json()["macros"][0]
    changed = post_form(sam, f"/macros/{first}", **{**kept, "body": "Stored, not exported."})
    assert changed.status_code == 500
    assert "Saved, but the library file" in changed.text and "could not be written" in changed.text
    assert sam.get("/api/reply-library").json()["macros"][0]["body"] == "Stored, not exported."

    export.parent.unlink()
    assert post_form(sam, f"/macros/{first}", **{**kept, "body": "Exported again."}).status_code == 303
    assert read_library(export).macros[0].body == "Exported again."


def test_a_dashboard_that_cannot_write_its_library_file_does_not_start(staffed, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    app = create_app(dashboard_settings(staffed[0], reply_library=str(tmp_path / "a-file" / "library.json")))
    with pytest.raises(macros.NotExported, match="could not be written"), TestClient(app):
        pass
