// The thread browser of `roder serve` (docs/serve.md): the thread list, a thread's
// transcript, its live stream, an input box and approve/deny buttons. Plain DOM, no
// framework and no build step; user text only ever goes through textContent.
"use strict";

(() => {
  const TOKEN_KEY = "roder.token";
  const PAGE = 50;
  const EVENT_TYPES = [
    "turn_started", "model_step_started", "assistant_content_delta", "item_completed",
    "usage_updated", "compaction_started", "compaction_committed", "compaction_discarded",
    "tool_call_started", "tool_approval_requested", "tool_approval_decided", "warning",
    "error", "turn_complete", "turn_aborted", "input_accepted",
  ];

  const $ = (id) => document.getElementById(id);
  const firstPrompts = new Map(); // thread id -> first prompt (it never changes)

  // What the page shows of the open thread; `sequences` is every journal sequence it
  // applied, in order (the tests read it through window.roderBrowser).
  let view = null;
  let nextCursor = null;
  let pagedOn = false; // "More" was pressed: the periodic refresh would drop those pages

  const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function notice(text) {
    const box = $("notice");
    box.textContent = text || "";
    box.hidden = !text;
  }

  // A failure's notice, unless it is a missing token: api() has asked for one already.
  function failed(what, error) {
    if (error.status !== 401) notice(`${what} failed: ${error.message}`);
  }

  class HttpError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  async function api(method, path, body) {
    const headers = {};
    if (token()) headers.Authorization = `Bearer ${token()}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 204) return null;
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const detail = (data && (data.detail || data.title)) || response.statusText;
      if (response.status === 401) {
        notice("The server needs a token: enter it above.");
        $("token").focus();
      }
      throw new HttpError(response.status, detail);
    }
    return data;
  }

  const threadPath = (id) => `/v1/threads/${encodeURIComponent(id)}`;

  // Events with sequence in (after, upto], read page by page.
  async function readEvents(threadId, after, upto) {
    const events = [];
    while (after < upto) {
      const limit = Math.min(upto - after, 1000);
      const page = await api("GET", `${threadPath(threadId)}/events?after=${after}&limit=${limit}`);
      if (!page.events.length) break;
      for (const entry of page.events) if (entry.sequence <= upto) events.push(entry);
      after = page.events[page.events.length - 1].sequence;
    }
    return events;
  }

  // --- the thread list -----------------------------------------------------------------

  function promptOf(entries) {
    for (const entry of entries) {
      const event = entry.event;
      if (event.type === "item_completed" && event.item.type === "user_message") return event.item.text;
      if (event.type === "input_accepted" && !event.steer) return event.text;
    }
    return null;
  }

  async function firstPrompt(threadId) {
    if (firstPrompts.has(threadId)) return firstPrompts.get(threadId);
    const page = await api("GET", `${threadPath(threadId)}/events?after=0&limit=20`);
    const text = promptOf(page.events);
    if (text !== null) firstPrompts.set(threadId, text);
    return text;
  }

  function threadEntry(metadata) {
    const li = el("li", "thread");
    li.dataset.threadId = metadata.thread_id;
    if (view && view.threadId === metadata.thread_id) li.classList.add("selected");
    const link = el("a");
    link.href = `#/threads/${encodeURIComponent(metadata.thread_id)}`;
    const prompt = el("span", "first-prompt", firstPrompts.get(metadata.thread_id) || "…");
    link.append(prompt);
    if (metadata.title) link.prepend(el("strong", "title", metadata.title));
    const when = new Date(metadata.updated_at_ms);
    link.append(el("time", "updated", when.toLocaleString()));
    li.append(link);
    if (!firstPrompts.has(metadata.thread_id)) {
      firstPrompt(metadata.thread_id)
        .then((text) => { prompt.textContent = text === null ? "(no prompt yet)" : text; })
        .catch(() => { prompt.textContent = "(no prompt yet)"; });
    }
    return li;
  }

  async function loadThreads(more) {
    const cursor = more && nextCursor ? `&cursor=${encodeURIComponent(nextCursor)}` : "";
    const page = await api("GET", `/v1/threads?limit=${PAGE}${cursor}`);
    const list = $("threads");
    if (!more) list.replaceChildren();
    pagedOn = Boolean(more);
    for (const metadata of page.threads) list.append(threadEntry(metadata));
    nextCursor = page.next_cursor;
    $("more-threads").hidden = !nextCursor;
  }

  function refreshThreads() {
    loadThreads(false).catch((error) => failed("Listing threads", error));
  }

  // --- one thread: transcript, stream, approvals ------------------------------------------

  function itemNode(item) {
    switch (item.type) {
      case "user_message":
        return el("div", "item user", item.text);
      case "assistant_message": {
        const node = el("div", "item assistant", item.text);
        if (item.interrupted) node.append(el("span", "tag", "interrupted"));
        return node;
      }
      case "reasoning": {
        const node = el("details", "item reasoning");
        node.append(el("summary", "", "reasoning"), el("div", "", item.text));
        return node;
      }
      case "tool_call":
        return el("div", "item tool-call", `${item.name}(${item.arguments})`);
      case "tool_result": {
        const node = el("div", `item tool-result${item.is_error ? " error" : ""}`);
        node.append(el("span", "tool-name", `${item.name} → `), el("span", "", item.result));
        return node;
      }
      case "context_compaction":
        return el("div", "item compaction", `summary: ${item.summary}`);
      case "provider_metadata":
        return el("div", "item compaction", "provider metadata (compaction boundary)");
      default:
        return el("div", "item", `${item.type}`);
    }
  }

  function note(text, className) {
    view.transcript.append(el("div", `note ${className || ""}`, text));
  }

  function liveBlock(event) {
    const key = `${event.turn_id}:${event.phase}`;
    let node = view.live.get(key);
    if (!node) {
      node = el("div", `item live ${event.phase === "reasoning" ? "reasoning" : "assistant"}`);
      view.live.set(key, node);
      view.transcript.append(node);
    }
    return node;
  }

  function dropLive(turnId, phase) {
    for (const [key, node] of view.live) {
      if (key.startsWith(`${turnId}:`) && (!phase || key.endsWith(`:${phase}`))) {
        node.remove();
        view.live.delete(key);
      }
    }
  }

  function approvalCard(event) {
    const card = el("div", "approval");
    card.dataset.callId = event.call_id;
    card.append(el("span", "question", `Run ${event.name}(${event.arguments})?`));
    const approve = el("button", "approve", "Approve");
    const deny = el("button", "deny", "Deny");
    approve.type = deny.type = "button";
    const decide = (approved) => {
      approve.disabled = deny.disabled = true;
      const path = `${threadPath(view.threadId)}/approvals/${encodeURIComponent(event.call_id)}`;
      api("POST", path, { approved }).catch((error) => {
        // 409: decided meanwhile (the stream says how); anything else can be retried.
        if (error.status !== 409) approve.disabled = deny.disabled = false;
        notice(`Answering the approval failed: ${error.message}`);
      });
    };
    approve.addEventListener("click", () => decide(true));
    deny.addEventListener("click", () => decide(false));
    card.append(approve, deny);
    view.approvals.set(event.call_id, card);
    view.transcript.append(card);
  }

  function decided(event) {
    const card = view.approvals.get(event.call_id);
    if (!card) return;
    card.classList.add("decided");
    card.querySelectorAll("button").forEach((button) => button.remove());
    card.append(el("span", "decision", event.approved ? "approved" : `denied${event.reason ? `: ${event.reason}` : ""}`));
  }

  function setRunning(running) {
    view.running = running;
    $("thread-pane").dataset.running = running ? "true" : "false";
  }

  // Apply one journal event. `shown` is true for events the transcript from /items
  // already holds (the tail read at load): their items are not drawn again.
  function apply(entry, shown) {
    const event = entry.event;
    switch (event.type) {
      case "turn_started":
        setRunning(true);
        break;
      case "assistant_content_delta":
        liveBlock(event).textContent += event.delta;
        break;
      case "item_completed": {
        const item = event.item;
        if (item.type === "assistant_message") dropLive(event.turn_id, "final_answer");
        if (item.type === "reasoning") dropLive(event.turn_id, "reasoning");
        if (item.type === "user_message") {
          const queued = view.queued.get(event.turn_id);
          if (queued) { queued.remove(); view.queued.delete(event.turn_id); }
        }
        if (shown || view.skipItems > 0) {
          if (!shown) view.skipItems -= 1;
        } else {
          view.transcript.append(itemNode(item));
        }
        break;
      }
      case "input_accepted":
        if (!event.steer && !view.queued.has(event.turn_id)) {
          const node = el("div", "item user queued", event.text);
          view.queued.set(event.turn_id, node);
          view.transcript.append(node);
        }
        break;
      case "tool_approval_requested":
        approvalCard(event);
        break;
      case "tool_approval_decided":
        if (shown) {
          // Decided before the page opened: nothing to answer, the items tell the rest.
          const card = view.approvals.get(event.call_id);
          if (card) card.remove();
          view.approvals.delete(event.call_id);
        } else {
          decided(event);
        }
        break;
      case "warning":
        if (!shown) note(`warning: ${event.message}`, "warning");
        break;
      case "error":
        if (!shown) note(`error: ${event.message}`, "error");
        break;
      case "turn_complete":
        dropLive(event.turn_id);
        setRunning(false);
        break;
      case "turn_aborted":
        dropLive(event.turn_id);
        setRunning(false);
        note(`turn aborted: ${event.reason}`, "aborted");
        break;
      default:
        break;
    }
  }

  function streamState(state) {
    const badge = $("stream-state");
    badge.dataset.state = state;
    badge.textContent = state;
  }

  function onStreamed(message) {
    // A journal event named "error" shares its name with EventSource's own error event;
    // only a message carries data.
    if (!view || message.target !== view.source || typeof message.data !== "string") return;
    const entry = JSON.parse(message.data);
    streamState("live");
    if (entry.sequence <= view.lastSequence) {
      view.duplicates += 1; // never expected: the server sends each sequence once
      return;
    }
    if (entry.sequence !== view.lastSequence + 1) view.gaps += 1;
    view.lastSequence = entry.sequence;
    view.sequences.push(entry.sequence);
    apply(entry, false);
    view.transcript.scrollTop = view.transcript.scrollHeight;
  }

  function openStream() {
    const params = new URLSearchParams({ after: String(view.lastSequence) });
    // EventSource cannot send headers: the token goes in the query.
    if (token()) params.set("access_token", token());
    const source = new EventSource(`${threadPath(view.threadId)}/stream?${params}`);
    view.source = source;
    for (const type of EVENT_TYPES) source.addEventListener(type, onStreamed);
    source.addEventListener("open", () => streamState("live"));
    source.addEventListener("error", (event) => {
      if (!view || view.source !== source || event instanceof MessageEvent) return;
      // CONNECTING: the browser reconnects by itself, sending Last-Event-ID. CLOSED: the
      // server answered with an error (a restart's 503, say): open again after a pause.
      streamState("reconnecting");
      if (source.readyState === EventSource.CLOSED) {
        view.reopen = setTimeout(() => { if (view && view.source === source) openStream(); }, 1000);
      }
    });
  }

  function closeView() {
    if (!view) return;
    if (view.source) view.source.close();
    clearTimeout(view.reopen);
    view = null;
  }

  // The last turn's events up to `upto` (from its turn_started): what /items cannot say
  // (a running turn's partial text, its pending approvals and queued input).
  async function lastTurn(threadId, upto) {
    let span = 256;
    for (;;) {
      const start = Math.max(0, upto - span);
      const events = await readEvents(threadId, start, upto);
      const begin = events.map((e) => e.event.type).lastIndexOf("turn_started");
      if (begin >= 0) return events.slice(begin);
      if (start === 0) return events;
      span *= 4;
    }
  }

  async function openThread(threadId) {
    closeView();
    const transcript = $("transcript");
    transcript.replaceChildren();
    $("thread-title").textContent = threadId;
    document.querySelectorAll("#threads li").forEach((li) => {
      li.classList.toggle("selected", li.dataset.threadId === threadId);
    });
    const current = {
      threadId, transcript, lastSequence: 0, sequences: [], duplicates: 0, gaps: 0,
      skipItems: 0, live: new Map(), approvals: new Map(), queued: new Map(),
      running: false, source: null, reopen: null,
    };
    view = current;
    streamState("loading");
    try {
      const metadata = await api("GET", threadPath(threadId));
      if (metadata.title) $("thread-title").textContent = metadata.title;
      const { items } = await api("GET", `${threadPath(threadId)}/items`);
      const tail = await lastTurn(threadId, metadata.last_sequence);
      if (view !== current) return;
      for (const item of items) transcript.append(itemNode(item));
      // Items completed after the metadata was read are in `items` and come again on the
      // stream: skip that many item_completed events (item_count counts them all).
      current.skipItems = Math.max(0, items.length - metadata.item_count);
      for (const entry of tail) apply(entry, true);
      current.lastSequence = metadata.last_sequence;
      openStream();
    } catch (error) {
      if (view === current) {
        streamState("failed");
        notice(error.status === 404 ? `No thread ${threadId}.` : `Opening the thread failed: ${error.message}`);
      }
    }
  }

  // --- input ---------------------------------------------------------------------------

  async function send() {
    const input = $("run-input");
    const text = input.value;
    if (!text.trim()) return;
    $("run-send").disabled = true;
    try {
      if (!view) {
        const created = await api("POST", "/v1/threads", {});
        location.hash = `#/threads/${encodeURIComponent(created.thread_id)}`;
        await openThread(created.thread_id);
      }
      await api("POST", `${threadPath(view.threadId)}/runs`, { input: text });
      input.value = "";
      notice("");
      refreshThreads();
    } catch (error) {
      notice(`Starting the run failed: ${error.message}`);
    } finally {
      $("run-send").disabled = false;
    }
  }

  async function newThread() {
    try {
      const created = await api("POST", "/v1/threads", {});
      location.hash = `#/threads/${encodeURIComponent(created.thread_id)}`;
      refreshThreads();
      $("run-input").focus();
    } catch (error) {
      notice(`Creating a thread failed: ${error.message}`);
    }
  }

  function route() {
    const match = location.hash.match(/^#\/threads\/(.+)$/);
    if (match) {
      const threadId = decodeURIComponent(match[1]);
      if (!view || view.threadId !== threadId) openThread(threadId);
    } else {
      closeView();
      $("transcript").replaceChildren();
      $("thread-title").textContent = "No thread selected";
      streamState("idle");
    }
  }

  function start() {
    $("token").value = token();
    $("token-form").addEventListener("submit", (submit) => {
      submit.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      notice("");
      refreshThreads();
      if (view) openThread(view.threadId);
    });
    $("run-form").addEventListener("submit", (submit) => { submit.preventDefault(); send(); });
    $("run-input").addEventListener("keydown", (key) => {
      if (key.key === "Enter" && !key.shiftKey) { key.preventDefault(); send(); }
    });
    $("new-thread").addEventListener("click", newThread);
    $("refresh-threads").addEventListener("click", refreshThreads);
    $("more-threads").addEventListener("click", () => {
      loadThreads(true).catch((error) => failed("Listing threads", error));
    });
    window.addEventListener("hashchange", route);
    refreshThreads();
    route();
    // Other clients start threads too: keep the list fresh while the page is visible.
    setInterval(() => { if (!document.hidden && !pagedOn) refreshThreads(); }, 5000);
  }

  // For tests and the curious: what the open thread's stream delivered.
  window.roderBrowser = {
    get state() {
      return view && {
        threadId: view.threadId, lastSequence: view.lastSequence, sequences: view.sequences.slice(),
        duplicates: view.duplicates, gaps: view.gaps, running: view.running,
      };
    },
  };

  start();
})();
