// Server-sent events from a fetch() body: bytes in, one callback per event's data out.
// Handles events split across network chunks (and multi-byte characters split across
// them), CRLF line ends, comments, and multi-line `data:` fields, as the SSE spec says.
"use strict";

async function readEvents(body, onData) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let newline;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      // A CR ending the chunk may be the first half of a CRLF: wait for the next one.
      if (newline === buffer.length - 1 && buffer[newline] === "\r") break;
      const line = buffer.slice(0, newline);
      const width = buffer.startsWith("\r\n", newline) ? 2 : 1;
      buffer = buffer.slice(newline + width);
      if (line === "") {
        if (data.length) {
          const stop = onData(data.join("\n"));
          data = [];
          if (stop) {
            await reader.cancel();
            return;
          }
        }
      } else if (line.startsWith("data:")) {
        data.push(line.slice(5).replace(/^ /, ""));
      }
      // `event:`, `id:`, `retry:` and `:` comments carry nothing this page needs.
    }
  }
}
