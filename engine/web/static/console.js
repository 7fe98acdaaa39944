// The serial console of a running VM, in a terminal (xterm.js, imported when
// first opened) over the websocket GET /v1/vms/NAME/console; the CSRF token
// goes as the query parameter a browser can set.

import { cookie, enc } from "./api.js";
import { $ } from "./dom.js";

let session = null;                 // {socket, terminal}

export async function openConsole(vm) {
  closeConsole();
  const { Terminal } = await import("./vendor/xterm/xterm.mjs");
  const dialog = $("console");
  const status = $("console-status");
  $("console-title").textContent = `Console of ${vm.name} on ${vm.host}`;
  status.textContent = "connecting";
  status.className = "";
  dialog.showModal();
  const terminal = new Terminal({ cols: 100, rows: 30, fontSize: 14, scrollback: 2000,
                                  fontFamily: "ui-monospace, 'DejaVu Sans Mono', monospace" });
  terminal.open($("terminal"));
  terminal.focus();
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(`${scheme}//${location.host}/v1/vms/${enc(vm.name)}/console` +
                               `?csrf=${enc(cookie("peerctl_csrf"))}`);
  socket.binaryType = "arraybuffer";
  session = { socket, terminal };
  const encoder = new TextEncoder();
  let ended = "";                   // the server's whole line (a close frame's reason is cut)
  socket.addEventListener("message", (event) => {
    if (typeof event.data === "string") {
      const message = JSON.parse(event.data);
      if (message.attached) {
        status.textContent = `attached to ${message.attached.vm} on ${message.attached.host}` +
          " (a quiet console shows its prompt after Enter)";
      }
      if (message.ended) ended = message.ended;
    } else {
      terminal.write(new Uint8Array(event.data));
    }
  });
  socket.addEventListener("close", (event) => {
    status.textContent = ended || event.reason ||
      (event.code === 1006 ? "could not open the console (refused, or the server is unreachable)"
        : `console closed (${event.code})`);
    status.className = event.code === 1000 ? "" : "error";
  });
  terminal.onData((data) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
  });
}

export function closeConsole() {
  if (!session) return;
  session.socket.close(1000, "the browser left the console");
  session.terminal.dispose();
  session = null;
}

export function setUpConsole() {
  $("console-close").addEventListener("click", () => $("console").close());
  $("console").addEventListener("close", closeConsole);
  $("console").addEventListener("cancel", (event) => event.preventDefault());   // Esc is the guest's
}
