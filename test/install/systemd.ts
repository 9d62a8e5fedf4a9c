import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { waitUntil } from "../harness/process.ts";

const run = promisify(execFile);

const SYSTEMD = ["/lib/systemd/systemd", "/usr/lib/systemd/systemd"].find((p) => existsSync(p));

function onPath(cmd: string): boolean {
  return (process.env.PATH ?? "").split(":").some((dir) => dir && existsSync(join(dir, cmd)));
}

/** Mount points of the cgroup hierarchies, from this process's mount table. */
function cgroupMounts(): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((line) => line.split(" "))
    .filter((f) => /^cgroup2?$/.test(f[f.indexOf("-") + 1] ?? ""))
    .map((f) => f[4]!);
}

/**
 * Why a private service manager cannot run here, or undefined when it can.
 * The tests run units under a systemd of their own (below) rather than the
 * host's: CI machines and sandboxes rarely boot systemd as PID 1, and a
 * host's system manager is not a test's to fill with units.
 */
export function whyNoManager(): string | undefined {
  if (!SYSTEMD || !onPath("systemctl")) return 'systemd is not installed (README.md, "Test it")';
  if (process.getuid?.() !== 0) {
    return `a private systemd manager needs root (its own cgroup subtree and a mount namespace); this runs as uid ${process.getuid?.()}`;
  }
  for (const tool of ["setpriv", "unshare"])
    if (!onPath(tool)) return `${tool} (util-linux) is not installed`;
  if (cgroupMounts().length === 0) return "no cgroup file system is mounted";
  return undefined;
}

/*
 * Runs in a private mount namespace (unshare --mount), then becomes the
 * manager. First it moves itself into a cgroup of its own in every
 * hierarchy: a manager started in the root cgroup would take every process
 * of the machine into its init.scope. Then it makes sd_booted() true inside
 * its namespace only (a tmpfs over /run/systemd holding system/), with the
 * inaccessible nodes a system manager would have created there, which
 * ProtectHome= and friends mount over what they hide. cpuset is left out:
 * a v1 cpuset cgroup admits no process before cpus and mems are set.
 */
const BOOT = `set -e
for m in $(awk '{ for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i+1) ~ /^cgroup2?$/) print $5; break } }' /proc/self/mountinfo); do
  case "$m" in */cpuset) continue ;; esac
  mkdir -p "$m/$1"
  echo $$ > "$m/$1/cgroup.procs"
done
if [ -d /run/systemd ]; then mount -t tmpfs -o mode=755 tmpfs /run/systemd
else mount -t tmpfs -o mode=755 tmpfs /run && mkdir /run/systemd; fi
mkdir -p /run/systemd/system /run/systemd/inaccessible/dir
cd /run/systemd/inaccessible
touch reg && mkfifo fifo && mknod chr c 0 0 && mknod blk b 0 0
chmod 000 dir reg fifo chr blk
cd /
export XDG_RUNTIME_DIR="$2" XDG_CONFIG_HOME="$2/config" XDG_STATE_HOME="$2/state" XDG_CACHE_HOME="$2/cache" HOME="$2/home"
exec "$3" --user
`;

export interface UnitManager {
  /** Where unit files and their drop-in directories go. */
  unitDir: string;
  /** What %S expands to for this manager's units. */
  stateRoot: string;
  systemctl(...args: string[]): Promise<string>;
  /** The manager's view of one unit property (systemctl show --value). */
  property(unit: string, name: string): Promise<string>;
  /** Stops the manager, kills what is left of its units and removes its cgroups. */
  close(): Promise<void>;
}

/**
 * A real systemd (the user-mode manager of the installed systemd package,
 * running as root) confined to a cgroup subtree named `name`. Units run
 * under it are started, restarted and killed exactly as the system manager
 * does it: KillMode= and the sandboxing settings are the same code.
 */
export async function startPrivateManager(dir: string, name: string): Promise<UnitManager> {
  const runtime = join(dir, "runtime");
  for (const d of ["", "config", "state", "cache", "home"])
    mkdirSync(join(runtime, d), { recursive: true, mode: 0o700 });
  // PDEATHSIG: if this test process dies, so does its manager.
  const child: ChildProcess = spawn(
    "setpriv",
    [
      "--pdeathsig",
      "KILL",
      "unshare",
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      BOOT,
      "boot",
      name,
      runtime,
      SYSTEMD!,
    ],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr!.on("data", (c: Buffer) => {
    stderr += c;
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const stop = async () => {
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
    await exited;
    clearTimeout(timer);
    await removeCgroups(name);
  };
  const env = { ...process.env, XDG_RUNTIME_DIR: runtime };
  const systemctl = async (...args: string[]) =>
    (await run("systemctl", ["--user", ...args], { env })).stdout;
  const property = async (unit: string, prop: string) =>
    (await systemctl("show", "--value", "-p", prop, unit)).trim();
  try {
    await waitUntil(
      "the private systemd manager",
      async () => {
        if (child.exitCode !== null) throw new Error(`the manager exited (${child.exitCode}): ${stderr}`);
        // "degraded": some unit of the default target failed, none of ours.
        return ["running", "degraded"].includes(
          (await systemctl("show", "--value", "-p", "SystemState")).trim(),
        );
      },
      20_000,
    );
    // %S: the state directory root of a user manager differs between
    // systemd versions ($XDG_CONFIG_HOME, later $XDG_STATE_HOME).
    const probe = join(dir, "state-root");
    await run(
      "systemd-run",
      [
        "--user",
        "--wait",
        "--quiet",
        "-p",
        "StateDirectory=probe",
        "-p",
        `StandardOutput=file:${probe}`,
        "sh",
        "-c",
        'echo "$STATE_DIRECTORY"',
      ],
      { env },
    );
    const unitDir = join(runtime, "systemd", "user");
    mkdirSync(unitDir, { recursive: true });
    return {
      unitDir,
      stateRoot: readFileSync(probe, "utf8")
        .trim()
        .replace(/\/probe$/, ""),
      systemctl,
      property,
      close: stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Every directory of the cgroup subtree `name`, in every hierarchy, deepest first. */
function cgroupDirs(name: string): string[] {
  const dirs: string[] = [];
  const walk = (d: string) => {
    dirs.push(d);
    for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(join(d, e.name));
  };
  for (const mount of cgroupMounts()) if (existsSync(join(mount, name))) walk(join(mount, name));
  return dirs.reverse();
}

/** Kills what is left in the subtree `name` (units' leftovers, such as engines) and removes it. */
async function removeCgroups(name: string): Promise<void> {
  for (const d of cgroupDirs(name)) {
    for (const pid of readFileSync(join(d, "cgroup.procs"), "utf8").split("\n").filter(Boolean)) {
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {
        // already gone
      }
    }
  }
  // A killed process leaves its cgroup only once it has been reaped.
  await waitUntil(`cgroup subtree ${name} removed`, () => {
    for (const d of cgroupDirs(name)) {
      try {
        rmdirSync(d);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "EBUSY") return undefined;
        throw err;
      }
    }
    return true;
  });
}
