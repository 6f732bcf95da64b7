// ChatLens dashboard: live updates (SSE), keyboard shortcuts, clipboard. No framework; htmx
// does the swapping. Text from chats is never inserted as HTML here (textContent only).
(() => {
  "use strict";

  const $ = (selector, root = document) => root.querySelector(selector);
  const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));
  const meta = (name) => $(`meta[name="${name}"]`)?.content || "";
  const csrf = () => meta("csrf-token");
  const me = () => meta("username");

  // ---------- small helpers ----------
  let toastTimer = null;
  function toast(text) {
    const el = $("#toast");
    if (!el) return;
    el.textContent = text;
    el.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { el.hidden = true; }, 2600);
  }

  function ago(iso) {
    const seconds = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 60) return "now";
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
    if (seconds < 86400) {
      const minutes = String(Math.floor((seconds % 3600) / 60)).padStart(2, "0");
      return `${Math.floor(seconds / 3600)} h ${minutes}`;
    }
    return `${Math.floor(seconds / 86400)} d`;
  }
  function refreshTimes() {
    $$("time[data-ago]").forEach((el) => { el.textContent = ago(el.getAttribute("datetime")); });
  }

  const chat = () => $("#chat");
  const currentChatId = () => chat()?.dataset.chatId || null;
  const draft = () => $("#draft");
  const draftDirty = () => { const d = draft(); return !!d && d.value !== d.defaultValue; };

  // ---------- queue and detail refresh ----------
  function syncSelection() {
    const id = currentChatId();
    const selected = $("#selected");
    if (selected) selected.value = id || "";
    $$("#chat-list a.chat-row").forEach((row) => {
      const on = row.dataset.chatId === id;
      row.classList.toggle("selected", on);
      if (on) row.setAttribute("aria-current", "true"); else row.removeAttribute("aria-current");
    });
    const c = chat();
    if (c) document.title = `${c.dataset.chatId} · Queue · ChatLens`;
  }

  let knownIds = null;
  function rememberRows() { knownIds = new Set($$("#chat-list a.chat-row").map((a) => a.dataset.chatId)); }
  function markFreshRows() {
    if (knownIds) {
      $$("#chat-list a.chat-row").forEach((a) => { if (!knownIds.has(a.dataset.chatId)) a.classList.add("fresh"); });
    }
    rememberRows();
  }

  let queueTimer = null;
  function refreshQueue() {
    clearTimeout(queueTimer);
    queueTimer = setTimeout(() => { const f = $("#filters"); if (f && window.htmx) htmx.trigger(f, "refresh"); }, 250);
  }

  function refreshDetail() {
    const id = currentChatId();
    if (id && window.htmx) htmx.ajax("GET", `/chats/${encodeURIComponent(id)}`, { target: "#detail", swap: "innerHTML" });
  }

  function onChatEvent(data) {
    refreshQueue();
    const c = chat();
    if (!c || data.chat_id !== c.dataset.chatId) return;
    if (typeof data.version === "number" && data.version <= Number(c.dataset.version)) return;
    if (draftDirty() || (document.activeElement && document.activeElement.closest("#chat form"))) {
      const stale = $("#stale");
      if (stale) stale.hidden = false;  // never throw away what the agent is typing
    } else {
      refreshDetail();
    }
  }

  // ---------- live connection (Server-Sent Events) ----------
  let source = null;
  let lastEventId = null;
  let retryMs = 1000;
  let hadError = false;

  function setIndicator(id, state, label) {
    const el = document.getElementById(id);
    if (!el) return;
    el.dataset.state = state;
    $(".label", el).textContent = label;
  }

  const FEED_LABELS = { running: "Feed running", reconnecting: "Feed reconnecting…", starting: "Feed starting…", stopped: "Feed stopped", off: "Feed off" };

  function connect() {
    if (!$("#live")) return;
    const url = "/api/events" + (lastEventId ? `?after=${encodeURIComponent(lastEventId)}` : "");
    source = new EventSource(url);
    setIndicator("live", hadError ? "reconnecting" : "connecting", hadError ? "Reconnecting…" : "Connecting…");
    source.onopen = () => {
      setIndicator("live", "live", "Live");
      retryMs = 1000;
      if (hadError) { refreshQueue(); if (!draftDirty()) refreshDetail(); }  // catch up on anything missed
      hadError = false;
    };
    const track = (event) => { if (event.lastEventId) lastEventId = event.lastEventId; };
    source.addEventListener("hello", track);
    source.addEventListener("resync", (event) => { track(event); refreshQueue(); if (!draftDirty()) refreshDetail(); });
    source.addEventListener("chat", (event) => { track(event); onChatEvent(JSON.parse(event.data)); });
    source.addEventListener("errorlog", track);
    source.addEventListener("status", (event) => {
      const status = JSON.parse(event.data);
      if (status.feed) setIndicator("feed", status.feed, FEED_LABELS[status.feed] || status.feed);
    });
    source.onerror = () => {
      hadError = true;
      if (source.readyState === EventSource.CLOSED) {
        // The server refused the stream (logged out? restarted?): check, then try again.
        setIndicator("live", "offline", "Offline — retrying");
        source.close();
        setTimeout(checkSessionThenConnect, retryMs);
        retryMs = Math.min(retryMs * 2, 15000);
      } else {
        setIndicator("live", "reconnecting", "Reconnecting…");  // the browser retries with Last-Event-ID
      }
    };
  }

  function checkSessionThenConnect() {
    fetch("/api/session", { credentials: "same-origin" }).then((response) => {
      if (response.status === 401) { window.location.assign(`/login?next=${encodeURIComponent(location.pathname + location.search)}`); return; }
      connect();
    }).catch(() => setTimeout(checkSessionThenConnect, retryMs));
  }

  // ---------- clipboard ----------
  async function copyText(text) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch (_) {
      const area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "visually-hidden";
      document.body.appendChild(area);
      area.select();
      const ok = document.execCommand("copy");
      area.remove();
      return ok;
    }
  }

  async function copyReply() {
    const d = draft();
    const id = currentChatId();
    if (!d || !id || !d.value.trim()) { toast("No reply to copy."); return; }
    if (await copyText(d.value)) {
      toast(draftDirty() ? "Copied (unsaved edits included)." : "Reply copied to the clipboard.");
      fetch(`/chats/${encodeURIComponent(id)}/copied`, { method: "POST", headers: { "X-CSRF-Token": csrf() }, credentials: "same-origin" });
    } else {
      toast("Could not copy: select the text and press Ctrl+C.");
    }
  }

  // ---------- keyboard ----------
  function move(delta) {
    const rows = $$("#chat-list a.chat-row");
    if (!rows.length) return;
    const index = rows.findIndex((row) => row.dataset.chatId === currentChatId());
    const next = rows[index < 0 ? (delta > 0 ? 0 : rows.length - 1) : Math.min(rows.length - 1, Math.max(0, index + delta))];
    if (next && (index < 0 || next !== rows[index])) {
      next.click();
      next.scrollIntoView({ block: "nearest" });
    }
  }

  function click(selector) { const el = $(selector); if (el) el.click(); return !!el; }

  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.altKey) return;
    const target = event.target;
    const typing = target instanceof HTMLElement && target.matches("input, textarea, select, [contenteditable]");
    if (typing) {
      if (event.key === "Escape") target.blur();
      if ((event.ctrlKey || event.metaKey) && event.key === "Enter" && target.id === "draft") {
        event.preventDefault();
        click("#save");
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || $("#help")?.open) return;
    const actions = {
      j: () => move(1),
      k: () => move(-1),
      e: () => { const d = draft(); if (d) { d.focus(); d.setSelectionRange(d.value.length, d.value.length); } },
      a: () => click("#approve"),
      c: () => copyReply(),
      m: () => click("#assign-me"),
      "/": () => $("#q")?.focus(),
      "?": () => $("#help")?.showModal(),
    };
    const action = actions[event.key];
    if (action) { event.preventDefault(); action(); }
  });

  // ---------- wiring ----------
  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    if (target.closest("#copy")) { event.preventDefault(); copyReply(); }
    if (target.closest("#help-button")) $("#help")?.showModal();
    if (target.closest("#load-latest")) refreshDetail();
    const from = target.closest("[data-copy-from]");
    if (from) { const source = document.getElementById(from.dataset.copyFrom); if (source) copyText(source.textContent).then(() => toast("Copied.")); }
  });

  document.addEventListener("input", (event) => {
    if (event.target === draft()) $("#draft-count").textContent = String(draft().value.length);
  });

  document.addEventListener("htmx:afterSwap", (event) => {
    const target = event.detail.target;
    if (target.id === "queue") markFreshRows();
    syncSelection();
    refreshTimes();
  });
  document.addEventListener("htmx:configRequest", (event) => {
    // Keep the queue's selection highlighted across refreshes.
    if (event.detail.elt.id === "filters") event.detail.parameters.selected = currentChatId() || "";
  });
  document.addEventListener("htmx:afterRequest", (event) => {
    const elt = event.detail.elt;
    if (elt.id === "filters" && event.detail.successful) {
      const params = new URLSearchParams(new FormData(elt));
      params.delete("selected");
      for (const [key, value] of Array.from(params.entries())) if (!value || (key === "status" && value === "open")) params.delete(key);
      const id = currentChatId();
      const path = id ? `/chats/${encodeURIComponent(id)}` : "/";
      const query = params.toString();
      history.replaceState(history.state, "", query ? `${path}?${query}` : path);
    }
  });
  document.addEventListener("htmx:responseError", (event) => {
    const status = event.detail.xhr.status;
    toast(status === 403 ? "Not allowed (your session may have changed: reload the page)." : `Something went wrong (${status}).`);
  });
  document.addEventListener("htmx:sendError", () => toast("The server is not reachable. Retrying live updates…"));

  document.addEventListener("DOMContentLoaded", () => {
    rememberRows();
    syncSelection();
    refreshTimes();
    setInterval(refreshTimes, 30000);
    connect();
  });
})();
