// The live feed of job events: poll the attempts after the last one seen, while the
// page is visible, and put the new events on top. One request at a time.
(function () {
  "use strict";
  const MAX_ROWS = 500;

  function start() {
    const table = document.getElementById("pgqueue-feed");
    if (!table) return;
    const body = table.tBodies[0];
    const data = table.dataset;
    let after = data.after;
    let open = data.open;
    const seen = new Set(Array.from(body.rows, (row) => row.dataset.key));

    function time(iso) {
      return iso ? new Date(iso).toTimeString().slice(0, 8) : "";
    }

    function cell(row, text) {
      const td = row.insertCell();
      td.textContent = text;
      return td;
    }

    function add(event) {
      const key = event.attempt_id + ":" + event.event;
      if (seen.has(key)) return;
      seen.add(key);
      const row = body.insertRow(0);
      row.dataset.key = key;
      row.className = "pgqueue-event-" + event.event;
      cell(row, time(event.finished_at || event.started_at));
      const name = document.createElement("span");
      name.className = "pgqueue-event";
      name.textContent = event.event;
      row.insertCell().appendChild(name);
      const link = document.createElement("a");
      link.href = data.jobUrl.replace("/0/", "/" + event.job_id + "/");
      link.textContent = "#" + event.job_id;
      row.insertCell().appendChild(link);
      for (const text of [event.type, event.queue, event.attempt, event.worker_id, event.error_class || ""]) {
        cell(row, String(text));
      }
      while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
    }

    async function poll() {
      if (!document.hidden) {
        const query = new URLSearchParams({ after: after, open: open, queue: data.queue, type: data.type });
        if (data.database) query.set("database", data.database);
        try {
          const response = await fetch(data.poll + "?" + query, { credentials: "same-origin" });
          if (response.ok) {
            const found = await response.json();
            found.events.forEach(add);
            after = String(found.after);
            open = found.open.join(",");
            table.dataset.after = after;
          }
        } catch (error) {
          // The next poll tries again.
        }
      }
      setTimeout(poll, Number(data.seconds) * 1000);
    }

    setTimeout(poll, Number(data.seconds) * 1000);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
