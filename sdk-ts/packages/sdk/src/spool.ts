/**
 * The local spool: receipts and failures are written here, fsynced, before they are sent.
 *
 * One JSON file per event (`{"endpoint": …, "body": …}`, as the Python SDK writes them), named
 * so that sorting the names gives the order they were written in. A file is deleted only once
 * the server has acknowledged it, so an event outlives a crash, a lost connection or a server
 * that is away, and the next client on the same spool (in either language) sends it again.
 * Two processes on one spool may both send an event: the server stores it once.
 */

import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs";
import { homedir } from "node:os";
import * as path from "node:path";
import type { Json } from "./records.js";

export interface Entry {
  path: string;
  endpoint: string;
  body: Json;
}

/** $TALLYBOOK_SPOOL_DIR, else the user's cache directory, else ./.tallybook-spool. */
export function defaultRoot(): string {
  const configured = process.env.TALLYBOOK_SPOOL_DIR;
  if (configured) return configured;
  const cache = process.env.XDG_CACHE_HOME || path.join(homedir(), ".cache");
  const root = path.join(cache, "tallybook", "spool");
  try {
    fs.mkdirSync(root, { recursive: true, mode: 0o700 });
    fs.accessSync(root, fs.constants.W_OK);
    return root;
  } catch {
    return ".tallybook-spool";
  }
}

/** Each server and key has its own folder, so no event is replayed into another project. */
export function spoolDir(root: string, url: string, apiKey: string): string {
  const digest = createHash("sha256").update(`${url}\n${apiKey}`).digest("hex").slice(0, 16);
  return path.join(root, digest);
}

let sequence = 0;

export class Spool {
  readonly rejected: string;

  constructor(readonly directory: string) {
    this.rejected = path.join(directory, "rejected");
    fs.mkdirSync(this.rejected, { recursive: true, mode: 0o700 });
  }

  /** The pending events' files, oldest first. */
  pending(): string[] {
    return fs
      .readdirSync(this.directory)
      .filter((name) => name.endsWith(".json") && !name.startsWith("."))
      .sort()
      .map((name) => path.join(this.directory, name));
  }

  /** The entries of one effect, oldest first: what its next intent must not overtake. */
  pendingFor(key: string): Entry[] {
    return this.pending()
      .map((file) => this.read(file))
      .filter((entry): entry is Entry => entry !== null && entry.body.key === key);
  }

  /** Write an event durably (fsynced, then renamed into place) before anything else happens. */
  put(endpoint: string, body: Json): Entry {
    const data = JSON.stringify({ endpoint, body });
    // Nanoseconds since the epoch, as the Python SDK names its files, kept increasing here.
    const ns = BigInt(Date.now()) * 1_000_000n + BigInt(sequence++ % 1_000_000);
    const name = `${ns.toString().padStart(20, "0")}-${process.pid}-${randomBytes(4).toString("hex")}.json`;
    const file = path.join(this.directory, name);
    const tmp = path.join(this.directory, `.${name}.tmp`);
    const fd = fs.openSync(tmp, "wx", 0o600);
    try {
      fs.writeSync(fd, data);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
    const dir = fs.openSync(this.directory, "r");
    try {
      fs.fsyncSync(dir);
    } finally {
      fs.closeSync(dir);
    }
    return { path: file, endpoint, body };
  }

  /** A pending entry as written; null when it is gone (delivered meanwhile). */
  read(file: string): Entry | null {
    try {
      const event = JSON.parse(fs.readFileSync(file, "utf8"));
      return { path: file, endpoint: event.endpoint, body: event.body ?? {} };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw error;
    }
  }

  /** The server has the event: forget it. */
  done(entry: Entry): void {
    fs.rmSync(entry.path, { force: true });
  }

  /** The server refused the event: keep it aside, with the answer, for a person. */
  reject(entry: Entry, answer: string): void {
    const target = path.join(this.rejected, path.basename(entry.path));
    fs.writeFileSync(target.replace(/\.json$/, ".answer"), answer);
    try {
      fs.renameSync(entry.path, target);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    }
    console.error(`Tallybook refused spooled ${entry.endpoint} ${target}: ${answer}`);
  }
}
