// poolctl serve: refreshes the overview and the charts from the JSON API
// (short polling, no page reload) and runs admin actions with a bearer
// token kept in this tab's sessionStorage (never a cookie).
(function () {
  "use strict";
  var page = document.body.dataset.page;
  var admin = document.body.dataset.admin === "1";
  var banner = document.getElementById("banner");
  var status = document.getElementById("redis-status");
  // Chart geometry: keep in step with charts.rs.
  var W = 720, H = 90;

  function setReachable(ok, message) {
    status.textContent = ok ? "Redis ok" : "Redis unreachable";
    status.className = ok ? "ok" : "down";
    banner.hidden = ok;
    if (!ok) banner.textContent = message || "Redis unreachable";
  }

  function getJson(url) {
    return fetch(url, { headers: { Accept: "application/json" } }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
        return body;
      });
    });
  }

  function esc(s) {
    return String(s == null ? "-" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function dur(ms) {
    var s = ms / 1000;
    if (ms < 1000) return ms + "ms";
    if (ms < 60000) return s.toFixed(1) + "s";
    if (ms < 3600000) return (s / 60).toFixed(0) + "m";
    if (ms < 86400000) return (s / 3600).toFixed(1) + "h";
    return (s / 86400).toFixed(1) + "d";
  }

  function ago(ms) { return ms == null ? "-" : dur(ms) + " ago"; }

  function fill(id, items, row, empty, cols) {
    var body = document.getElementById(id);
    if (!body) return;
    body.innerHTML = items.length
      ? items.map(row).join("")
      : (empty ? '<tr><td colspan="' + cols + '">' + esc(empty) + "</td></tr>" : "");
  }

  function td(v, cls) { return "<td" + (cls ? ' class="' + cls + '"' : "") + ">" + v + "</td>"; }
  function code(v) { return "<code>" + esc(v) + "</code>"; }

  // The admin buttons of a worker row (pages.rs renders the same).
  function workerActions(state) {
    var drain = state === "drained"
      ? '<button data-worker-action="undrain">Undrain</button>'
      : '<button data-worker-action="drain">Drain</button>';
    return td(drain + '<button data-worker-action="remove">Remove</button>', "actions");
  }

  function renderOverview(v) {
    var counts = {
      running: v.jobs_by_state.running,
      pending: v.jobs_by_state.pending,
      orphaned: v.jobs_by_state.orphaned,
      queued_events: v.jobs_by_state.queued_events,
      active_workers: v.counts.active_workers + "/" + v.counts.workers,
      nodes: v.counts.nodes
    };
    document.querySelectorAll("[data-count]").forEach(function (el) {
      var k = el.dataset.count;
      if (k in counts) el.textContent = counts[k];
    });
    var meta = document.getElementById("reading-meta");
    if (meta) {
      meta.textContent = "Read " + dur(v.reading_age_ms) + " ago in " + dur(v.read_took_ms) +
        " · worker TTL " + dur(v.worker_ttl_ms) +
        (v.shutdown_requested_by ? " · shutdown requested by " + v.shutdown_requested_by : "");
    }
    fill("workers-body", v.workers, function (w) {
      return '<tr data-worker="' + esc(w.id) + '">' +
        td('<a href="/jobs?worker=' + encodeURIComponent(w.id) + '">' + code(w.id) + "</a>") +
        td('<span class="state ' + esc(w.state) + '">' + esc(w.state) + "</span>") +
        td(code(w.node)) + td(esc(w.host)) + td(esc(w.pid)) + td(esc(ago(w.keepalive_age_ms))) +
        td(esc(w.jobs), "n") + td(esc(w.inbox_length), "n") +
        (admin ? workerActions(w.state) : "") + "</tr>";
    }, "no worker", admin ? 9 : 8);
    fill("nodes-body", v.node_details, function (n) {
      return "<tr>" + td(code(n.id)) + td(esc(n.host)) + td(esc(n.pid)) +
        td(esc(n.age_ms == null ? "-" : dur(n.age_ms))) + td(esc(ago(n.keepalive_age_ms))) +
        td(esc(n.workers), "n") + td(esc(n.jobs), "n") + td(esc(n.version)) + "</tr>";
    }, null, 8);
    fill("locks-body", v.locks, function (l) {
      return "<tr>" + td(code(l.name)) + td(code(l.owner)) + td(esc(l.host)) + td(esc(l.pid)) +
        td(esc(l.token), "n") + td(esc(ago(l.heartbeat_age_ms))) + td(esc(dur(l.ttl_remaining_ms))) + "</tr>";
    }, "no lock held", 7);
    fill("schedules-body", v.schedules, function (s) {
      return "<tr>" + td(code(s.name)) + td(code(s.leader)) + td(esc(s.host)) +
        td(esc(s.token), "n") + td(esc(ago(s.heartbeat_age_ms))) + "</tr>";
    }, "no schedule has a leader", 5);
    fill("streams-body", v.streams, function (s) {
      return "<tr>" + td(code(s.name)) + td(esc(s.kind)) + td(esc(s.length), "n") +
        td(esc(s.groups.length), "n") + "</tr>";
    }, null, 4);
  }

  function points(values) {
    var max = Math.max.apply(null, values.concat([0]));
    var n = Math.max(values.length, 2) - 1;
    return values.map(function (v, i) {
      var y = max > 0 ? H - v / max * (H - 2) : H;
      return (i * W / n).toFixed(1) + "," + y.toFixed(1);
    }).join(" ");
  }

  function renderCharts(h) {
    h.series.forEach(function (s) {
      var fig = document.querySelector('figure[data-series="' + s.name + '"]');
      if (!fig) return;
      var max = Math.max.apply(null, s.values.concat([0]));
      fig.querySelector("polyline").setAttribute("points", points(s.values));
      fig.querySelector(".peak").textContent = "peak " + (max % 1 === 0 ? max : max.toFixed(1));
    });
  }

  // A page rendered while Redis was down reloads once it is back.
  function poll(url, render, every) {
    function tick() {
      getJson(url).then(function (body) {
        if (document.body.dataset.empty) { location.reload(); return; }
        setReachable(true);
        if (render) render(body);
      }).catch(function (e) {
        setReachable(false, e.message);
      });
    }
    setInterval(tick, every);
  }

  if (page === "overview") {
    poll("/api/overview", renderOverview, 2000);
    poll("/api/history", renderCharts, 5000);
  } else if (page === "history") {
    poll("/api/history", renderCharts, 5000);
  } else {
    poll("/api/overview", null, 5000);
  }

  // Posts an admin action with the token of the input, shows the answer.
  function act(url, what) {
    var input = document.getElementById("admin-token");
    var out = document.getElementById("action-result");
    var token = input ? input.value : "";
    sessionStorage.setItem("poolctl-admin-token", token);
    out.textContent = what + "…";
    fetch(url, { method: "POST", headers: { Authorization: "Bearer " + token } })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          out.textContent = r.status + ": " + (body.message || body.error || "");
        });
      })
      .catch(function (e) { out.textContent = e.message; });
  }

  var tokenInput = document.getElementById("admin-token");
  if (tokenInput) tokenInput.value = sessionStorage.getItem("poolctl-admin-token") || "";

  var actions = document.getElementById("actions");
  if (actions) {
    actions.querySelectorAll("button[data-action]").forEach(function (button) {
      button.addEventListener("click", function () {
        var url = "/api/jobs/" + encodeURIComponent(actions.dataset.key) + "/" + button.dataset.action;
        act(url, button.dataset.action);
      });
    });
  }

  // Worker rows are re-rendered on every refresh: one listener on the table.
  var workers = document.getElementById("workers");
  if (workers && admin) {
    workers.addEventListener("click", function (e) {
      var button = e.target.closest("button[data-worker-action]");
      if (!button) return;
      var id = button.closest("tr").dataset.worker;
      var action = button.dataset.workerAction;
      act("/api/workers/" + encodeURIComponent(id) + "/" + action, action + " " + id);
    });
  }
})();
