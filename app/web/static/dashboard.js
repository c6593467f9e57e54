// knobtune dashboard: the live parts, in plain JS (no library, no network beyond
// this service). A session page polls GET /api/v1/sessions/{id} (same origin, so
// the login cookie goes along), redraws the status line and a sparkline of
// per-second throughput, and swaps in fresh results when a trial completes.
// The index refreshes its sessions table while any session is active.
"use strict";

(function () {
  const ACTIVE = ["queued", "running"];
  const POLL_MS = 1500;

  function setText(el, text) {
    if (el && el.textContent !== text) el.textContent = text;
  }

  function fmtDuration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  }

  function fmtTps(v) {
    return Math.abs(v) >= 100 ? Math.round(v).toLocaleString("en-US") : v.toFixed(1);
  }

  function toLogin() {
    location.assign("/login?next=" + encodeURIComponent(location.pathname));
  }

  // Fetch a same-origin URL; null on any failure (the caller retries later).
  async function get(url, accept) {
    try {
      const r = await fetch(url, { headers: { Accept: accept }, cache: "no-store" });
      if (r.status === 401 || (r.redirected && new URL(r.url).pathname === "/login")) {
        toLogin();
        return null;
      }
      return r.ok ? r : null;
    } catch (_err) {
      return null;
    }
  }

  function drawSpark(svg, samples) {
    if (!svg) return;
    const n = samples.length;
    svg.dataset.samples = String(n);
    const line = svg.querySelector(".line");
    const area = svg.querySelector(".area");
    if (n === 0) {
      line.setAttribute("points", "");
      area.setAttribute("points", "");
      return;
    }
    const W = 600, H = 90, pad = 6;
    const hi = Math.max(...samples) * 1.1 || 1;
    // the y axis: the strip's top is hi tps (its bottom is 0); the x axis: seconds
    const top = document.querySelector("[data-live=axis-max]");
    if (top) top.textContent = Math.round(hi) + " tps";
    const end = document.querySelector("[data-live=axis-end]");
    if (end) end.textContent = n + " s";
    // One sample: a flat line across, so the first second is already visible.
    const vals = n === 1 ? [samples[0], samples[0]] : samples;
    const x = (i) => (i / (vals.length - 1)) * W;
    const y = (v) => H - pad - (v / hi) * (H - 2 * pad);
    const pts = vals.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1));
    line.setAttribute("points", pts.join(" "));
    area.setAttribute("points", x(0).toFixed(1) + "," + H + " " + pts.join(" ") + " " + x(vals.length - 1).toFixed(1) + "," + H);
  }

  function liveSession(root) {
    if (!ACTIVE.includes(root.dataset.status)) return;
    const id = root.dataset.sessionId;
    let done = Number(root.dataset.trialsDone);
    const $ = (sel) => root.querySelector(sel);

    async function tick() {
      const r = await get("/api/v1/sessions/" + id, "application/json");
      if (r === null) {
        setText($("[data-live=conn]"), "(no answer from the service; retrying)");
        setTimeout(tick, POLL_MS * 2);
        return;
      }
      const s = await r.json();
      setText($("[data-live=conn]"), "");
      if (!ACTIVE.includes(s.status)) {
        location.reload(); // final state: the server renders the whole page
        return;
      }
      const badge = $("[data-live=status]");
      setText(badge, s.status);
      badge.className = "badge " + s.status;
      setText($("[data-live=phase]"), s.phase);
      const p = s.progress;
      const prog = $("[data-live=progress]");
      prog.max = Math.max(p.trials_planned || 1, p.trials_done, 1);
      prog.value = p.trials_done;
      setText($("[data-live=trials]"), p.trials_done + (p.trials_planned ? " of ~ " + p.trials_planned : "") + " trials");
      setText($("[data-live=elapsed]"), fmtDuration(p.elapsed_s));
      setText($("[data-live=eta]"), fmtDuration(p.eta_s));
      const live = s.live_tps || [];
      drawSpark(document.getElementById("live-spark"), live);
      if (live.length) {
        setText($("[data-live=now]"),
          "now " + fmtTps(live[live.length - 1]) + " tps · min " + fmtTps(Math.min(...live)) +
          " · max " + fmtTps(Math.max(...live)) + " · " + live.length + (live.length === 1 ? " sample" : " samples"));
      } else {
        setText($("[data-live=now]"), "between benchmark runs (" + s.phase + ")");
      }
      if (p.trials_done !== done) {
        const frag = await get("/sessions/" + id + "/results", "text/html");
        if (frag !== null) {
          document.getElementById("results").innerHTML = await frag.text();
          done = p.trials_done;
        }
      }
      setTimeout(tick, POLL_MS);
    }
    tick();
  }

  function refreshSessions(box) {
    async function tick() {
      if (!box.querySelector("[data-active]")) return; // nothing running: stop polling
      const r = await get("/partials/sessions", "text/html");
      if (r !== null) box.innerHTML = await r.text();
      setTimeout(tick, POLL_MS * 2);
    }
    setTimeout(tick, POLL_MS * 2);
  }

  // The session form: each workload's own defaults as placeholders, and how long the
  // session may take (runs x run length), updated as the form changes.
  function sessionForm(form) {
    const est = document.getElementById("estimate");
    if (!est) return;
    const defaults = JSON.parse(est.dataset.defaults || "{}");
    const FIELDS = ["scale", "clients", "jobs", "duration_s", "warmup_s"];
    function num(name) {
      const el = form.elements[name];
      const v = el ? Number(el.value) : NaN;
      return el && el.value !== "" && v > 0 ? v : null;
    }
    function when(s) {
      if (s < 90) return s + " s";
      if (s < 5400) return Math.round(s / 60) + " min";
      return (s / 3600).toFixed(1) + " h";
    }
    function update() {
      const b = form.elements["builtin"].value;
      const mode = form.elements["mode"] ? form.elements["mode"].value : "power";
      const script = form.elements["script"] && form.elements["script"].value.trim() !== "";
      let key = b === "tpch" && mode === "throughput" ? "tpch-throughput" : b;
      if (key === "" && script) key = "none";
      const d = defaults[key] || defaults[""];
      for (const f of FIELDS) {
        const el = form.elements[f];
        if (el && d) el.placeholder = String(d[f]);
      }
      const runs = num("max_trials") || 30;
      const dur = num("duration_s") || (d ? d.duration_s : 60);
      est.textContent = "About " + when(runs * dur) + ": up to " + runs + " runs × " + dur +
        " s, plus loading the data and warming up after restarts.";
    }
    form.addEventListener("input", update);
    form.addEventListener("change", update);
    update();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("session-form");
    if (form) sessionForm(form);
    const session = document.getElementById("session");
    if (session) liveSession(session);
    const box = document.querySelector("[data-refresh-sessions]");
    if (box) refreshSessions(box);
  });
})();
