"""An independent reader of dpipe snapshot files, written from docs/snapshot-format.md alone.

Python 3 standard library only. It shares no code with dpipe: its own CRC-32C, its own parser of the
header, section table and sections, its own decoder of natively encoded elements. The test
snapshot_reader_test.py compares what it reads with `dpipe snapshot show`.

    snap = read_snapshot(open(path, "rb").read())   # dict; raises FormatError / ChecksumError
    decode_element("vec<i64>", blob)                 # Python value; raises NotNative for cereal: tags
"""
import struct

MAGIC = b"DPIPESNP"
HEADER_BYTES = 32
SECTION_ENTRY_BYTES = 24
MAX_SECTIONS = 64
KNOWN_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
SECTION_META, SECTION_STATES, SECTION_NODE_DETAILS, SECTION_IDENTITY, SECTION_STATE_INDEX = 1, 2, 3, 4, 5
INLINE_LIST_BYTES = 256  # a list whose lengths and bytes take more is stored apart in the state index
STATE_MODES = {1: "hook", 2: "stateless", 3: "replay"}
FIELD_TYPES = {1: "u64", 2: "i64", 3: "str", 4: "elements"}
SEGMENTS = ("prefix", "worker", "suffix")


class FormatError(Exception):
    """The bytes are not a well-formed snapshot."""


class ChecksumError(FormatError):
    """A stored CRC-32C does not match the bytes it covers."""


class NotNative(Exception):
    """An element's type tag is not one of the native encodings (e.g. a cereal: tag)."""


# ---- CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, init 0xFFFFFFFF, final xor 0xFFFFFFFF ----

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        c = (c >> 8) ^ t[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C


# ---- a bounds-checked little-endian cursor ----

class Cursor:
    def __init__(self, data, what):
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    def remaining(self):
        return len(self.data) - self.pos

    def done(self):
        return self.pos == len(self.data)

    def take(self, n):
        if n > self.remaining():
            raise FormatError(f"{self.what} is truncated: {n} bytes needed, {self.remaining()} left")
        b = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return b

    def unpack(self, fmt):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def u8(self):
        return self.unpack("<B")

    def u32(self):
        return self.unpack("<I")

    def i32(self):
        return self.unpack("<i")

    def u64(self):
        return self.unpack("<Q")

    def i64(self):
        return self.unpack("<q")

    def count(self, min_item_bytes):
        """A u64 count of items each at least min_item_bytes long; refused when it cannot fit."""
        n = self.u64()
        if min_item_bytes and n > self.remaining() // min_item_bytes:
            raise FormatError(f"{self.what}: a count of {n} does not fit in the {self.remaining()} bytes left")
        return n

    def blob(self):
        return self.take(self.count(1))

    def string(self):
        return self.blob().decode("utf-8", errors="surrogateescape")

    def end(self):
        if not self.done():
            raise FormatError(f"{self.what}: {self.remaining()} unexpected bytes at the end")


# ---- the file ----

def read_header(data):
    """The 32-byte header as a dict, its checksum verified."""
    if len(data) < HEADER_BYTES:
        raise FormatError(f"truncated: {len(data)} bytes, a header alone is {HEADER_BYTES}")
    if data[:8] != MAGIC:
        raise FormatError("wrong magic bytes")
    version, count, total, table_crc, header_crc = struct.unpack_from("<IIQII", data, 8)
    if crc32c(data[:28]) != header_crc:
        raise ChecksumError("header checksum mismatch")
    return {"format_version": version, "section_count": count, "total_length": total,
            "table_crc": table_crc, "header_crc": header_crc}


def read_snapshot(data):
    """Parses and verifies a whole snapshot file; returns a dict (see docs/snapshot-format.md)."""
    data = bytes(data)
    h = read_header(data)
    if h["format_version"] not in KNOWN_VERSIONS:
        raise FormatError(f"format version {h['format_version']} is not one this reader knows")
    if h["total_length"] != len(data):
        raise FormatError(f"the header says {h['total_length']} bytes, the file has {len(data)}")
    count = h["section_count"]
    if count > MAX_SECTIONS:
        raise FormatError(f"{count} sections claimed")
    table_end = HEADER_BYTES + count * SECTION_ENTRY_BYTES
    if table_end > len(data):
        raise FormatError("truncated inside the section table")
    table = data[HEADER_BYTES:table_end]
    if crc32c(table) != h["table_crc"]:
        raise ChecksumError("section table checksum mismatch")
    sections = []
    for i in range(count):
        sid, crc, off, length = struct.unpack_from("<IIQQ", table, i * SECTION_ENTRY_BYTES)
        if off < table_end or off > len(data) or length > len(data) - off:
            raise FormatError(f"section {sid} lies outside the file")
        body = data[off:off + length]
        if crc32c(body) != crc:
            raise ChecksumError(f"section {sid} checksum mismatch")
        sections.append({"id": sid, "crc": crc, "offset": off, "length": length, "body": body})

    ids = [s["id"] for s in sections]
    for sid in (SECTION_META, SECTION_STATES, SECTION_NODE_DETAILS, SECTION_IDENTITY, SECTION_STATE_INDEX):
        if ids.count(sid) > 1:
            raise FormatError(f"section {sid} appears {ids.count(sid)} times")
    if SECTION_META not in ids or SECTION_STATES not in ids:
        raise FormatError("the metadata or node-state section is missing")
    body = {s["id"]: s["body"] for s in sections}
    meta = decode_meta(body[SECTION_META])
    states = decode_states(body[SECTION_STATES])
    if h["format_version"] >= 5:
        for s in states:
            if s["mode"] == "replay":
                check_replay_record(s)
    for s in states:
        check_input_taken(s, h["format_version"])
    if SECTION_NODE_DETAILS in body:
        decode_node_details(body[SECTION_NODE_DETAILS], meta["graph"])
    if h["format_version"] >= 2 and SECTION_IDENTITY not in body:
        raise FormatError("the identity section is missing")
    meta["id"], meta["step"] = decode_identity(body[SECTION_IDENTITY]) if SECTION_IDENTITY in body else (0, None)
    if h["format_version"] >= 3 and SECTION_STATE_INDEX not in body:
        raise FormatError("the state index is missing")
    if SECTION_STATE_INDEX in body:
        states_entry = next(s for s in sections if s["id"] == SECTION_STATES)
        check_state_index(body[SECTION_STATE_INDEX], data, states_entry, states)
    return {"header": h, "sections": [{k: v for k, v in s.items() if k != "body"} for s in sections],
            "meta": meta, "states": states}


def read_file(path):
    with open(path, "rb") as f:
        return read_snapshot(f.read())


def _pairs(c):
    n = c.count(16)
    return [(c.string(), c.string()) for _ in range(n)]


def decode_meta(body):
    c = Cursor(body, "metadata section")
    m = {"fingerprint": c.u64(), "seed": c.u64(), "epoch": c.u64(),
         "layout": {"rank": c.i32(), "world_size": c.i32(), "num_workers": c.i32()},
         "elements_delivered": c.u64()}
    n = c.count(24)
    m["graph"] = [{"key": c.string(), "kind": c.string(), "element_type": c.string()} for _ in range(n)]
    m["user_metadata"] = dict(_pairs(c))
    c.end()
    return m


def decode_identity(body):
    """Section 4 (format 2): the snapshot's id and the user's step, or None."""
    c = Cursor(body, "identity section")
    ident, has_step, step = c.u64(), c.u8(), c.u64()
    if has_step > 1:
        raise FormatError(f"step flag {has_step}")
    c.end()
    return ident, (step if has_step else None)


def decode_node_details(body, graph):
    c = Cursor(body, "node-details section")
    n = c.count(16)
    if n != len(graph):
        raise FormatError(f"node details describe {n} nodes, the graph has {len(graph)}")
    for node in graph:
        node["segment"] = c.string()
        if node["segment"] not in SEGMENTS:
            raise FormatError(f"node {node['key']!r} has an unknown segment {node['segment']!r}")
        node["params"] = _pairs(c)
    c.end()


def replay_steps_for(count):
    """How many digest steps a replay record of `count` elements holds (version 5 on): one per power of
    two from 2^16 up to count."""
    return max(0, count.bit_length() - 16)


def check_replay_record(s):
    """A replay record of version 5 on: count and digest (u64), then digest_steps, a list of u64 of the
    length replay_steps_for(count)."""
    f = s["fields"]
    if ([x["name"] for x in f[:3]] != ["count", "digest", "digest_steps"]
            or [x["type"] for x in f[:3]] != ["u64", "u64", "elements"]):
        raise FormatError(f"replay record of {s['key']!r} does not begin with count, digest and digest_steps")
    steps = f[2]
    if steps["tag"] != "u64" or any(len(b) != 8 for b in steps["blobs"]) \
            or len(steps["blobs"]) != replay_steps_for(f[0]["value"]):
        raise FormatError(f"replay record of {s['key']!r}: {len(steps['blobs'])} digest steps for "
                          f"{f[0]['value']} elements")


INPUT_TAKEN = "input_taken"


def check_input_taken(s, version):
    """A node calling a Python callable saves how many elements it took from its input as a u64 field
    `input_taken` after its own fields (version 6 on); a stateless record has no other field of its own
    (only a held failure's three after it)."""
    names = [f["name"] for f in s["fields"]]
    for k, name in enumerate(names):
        if name != INPUT_TAKEN:
            continue
        f = s["fields"][k]
        if version < 6 or f["type"] != "u64":
            raise FormatError(f"record of {s['key']!r}: a field {INPUT_TAKEN!r} of type {f['type']} in a version "
                              f"{version} file (a u64, version 6 on)")
        if any(not later.startswith("deferred_") for later in names[k + 1:]) \
                or any(earlier.startswith("deferred_") for earlier in names[:k]):
            raise FormatError(f"record of {s['key']!r}: fields after its {INPUT_TAKEN!r} other than a held failure's, or a held failure's before it")
    if s["mode"] == "stateless":
        own = [n for n in names if n != INPUT_TAKEN and not n.startswith("deferred_")]
        if own:
            raise FormatError(f"record of {s['key']!r} is stateless but has a field {own[0]!r}")


def decode_states(body):
    c = Cursor(body, "node-state section")
    states = []
    for _ in range(c.count(29)):
        s = {"key": c.string(), "kind": c.string(), "instance": c.u32()}
        mode = c.u8()
        if mode not in STATE_MODES:
            raise FormatError(f"node {s['key']!r} has an unknown state mode {mode}")
        s["mode"] = STATE_MODES[mode]
        fields = []
        for _ in range(c.count(9)):
            name = c.string()
            t = c.u8()
            if t == 1:
                fields.append({"name": name, "type": "u64", "value": c.u64()})
            elif t == 2:
                fields.append({"name": name, "type": "i64", "value": c.i64()})
            elif t == 3:
                fields.append({"name": name, "type": "str", "value": c.string()})
            elif t == 4:
                tag = c.string()
                k = c.count(8)
                lengths = [c.u64() for _ in range(k)]
                if sum(lengths) > c.remaining():
                    raise FormatError(f"the elements of field {name!r} run past the section")
                blobs = [c.take(n) for n in lengths]
                fields.append({"name": name, "type": "elements", "tag": tag, "blobs": blobs})
            else:
                raise FormatError(f"field {name!r} of node {s['key']!r} has an unknown type {t}")
        s["fields"] = fields
        states.append(s)
    c.end()
    return states


def check_state_index(body, data, states_entry, states):
    """Section 5 (format 3): the node records again, each element list inline or stored apart (where its
    lengths and bytes lie in the file, and their CRC-32C). Verifies every stored list's checksum against
    the file and that the index says what the node states say."""
    c = Cursor(body, "state index")
    n = c.count(29)
    if n != len(states):
        raise FormatError(f"the state index has {n} records, the node states {len(states)}")
    lo, hi = states_entry["offset"], states_entry["offset"] + states_entry["length"]
    for s in states:
        head = (c.string(), c.string(), c.u32(), STATE_MODES.get(c.u8()))
        if head != (s["key"], s["kind"], s["instance"], s["mode"]):
            raise FormatError(f"the state index names {head}, the node states {s['key']!r} instance {s['instance']}")
        if c.count(9) != len(s["fields"]):
            raise FormatError(f"the state index gives node {s['key']!r} another field count")
        for f in s["fields"]:
            name, t = c.string(), c.u8()
            if name != f["name"] or FIELD_TYPES.get(t) != f["type"]:
                raise FormatError(f"the state index has field {name!r} where the node states have {f['name']!r}")
            if t == 1:
                same = c.u64() == f["value"]
            elif t == 2:
                same = c.i64() == f["value"]
            elif t == 3:
                same = c.string() == f["value"]
            else:
                tag, k, stored = c.string(), c.u64(), c.u8()
                encoded = b"".join(struct.pack("<Q", len(b)) for b in f["blobs"]) + b"".join(f["blobs"])
                if stored == 1:
                    off, length, crc = c.u64(), c.u64(), c.u32()
                    if off < lo or off + length > hi:
                        raise FormatError(f"field {name!r} of node {s['key']!r} is stored outside the node states")
                    if crc32c(data[off:off + length]) != crc:
                        raise ChecksumError(f"stored list {name!r} of node {s['key']!r} checksum mismatch")
                    same = data[off:off + length] == encoded and length > INLINE_LIST_BYTES
                elif stored == 0:
                    same = c.take(len(encoded)) == encoded and len(encoded) <= INLINE_LIST_BYTES
                else:
                    raise FormatError(f"field {name!r} has a list flag {stored}")
                same = same and tag == f["tag"] and k == len(f["blobs"])
            if not same:
                raise FormatError(f"the state index and the node states differ on field {name!r} of node {s['key']!r}")
    c.end()


# ---- the set index (docs/snapshot-format.md, "The set index") ----

INDEX_MAGIC = b"DPIPESIX"
SET_INDEX_VERSION = 3
MAX_INDEX_DIRECTORY = 1 << 30
VALUE_LIST_BYTES, POSITION_LIST_BYTES = 64, 4096


def _varint(c):
    v = shift = 0
    while True:
        b = c.u8()
        if shift == 63 and b > 1:
            raise FormatError(f"{c.what}: a varint runs past 64 bits")
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v
        shift += 7
        if shift > 63:
            raise FormatError(f"{c.what}: a varint runs past 64 bits")


def _text(c):
    return c.take(_varint(c))


def _index_list(c, count):
    how = c.u8()
    if how == 0:
        if _varint(c) != count:
            raise FormatError(f"{c.what}: a list's values are not as many as its count")
        lengths = [_varint(c) for _ in range(count)]
        return {"count": count, "blobs": [c.take(n) for n in lengths]}
    if how == 1:
        placed = {"count": count, "offset": _varint(c), "length": _varint(c), "crc": c.u32()}
        if count == 0 or count > placed["length"] // 8:
            raise FormatError(f"{c.what}: a list of {count} elements in {placed['length']} bytes")
        return placed
    if how == 2:
        if count != 0:
            raise FormatError(f"{c.what}: a list of {count} elements stored as empty")
        return {"count": 0, "blobs": []}
    raise FormatError(f"{c.what}: a list flag {how}")


def read_set_index(data):
    """A set index read whole: its identity (the manifest's text), W, K and per node its rows, each a
    dict of rank, instance, mode and the fields it has (name → (type, tag, value)). Every part's checksum
    is verified, and the parts must cover everything after the directory."""
    if len(data) < 20 or data[:8] != INDEX_MAGIC:
        raise FormatError("not a set index")
    version, dir_len, dir_crc = struct.unpack("<III", data[8:20])
    if version != SET_INDEX_VERSION:
        raise FormatError(f"set index version {version}")
    if 20 + dir_len > len(data) or dir_len > MAX_INDEX_DIRECTORY:
        raise FormatError("the set index directory runs past the file")
    directory, parts = data[20:20 + dir_len], data[20 + dir_len:]
    if crc32c(directory) != dir_crc:
        raise ChecksumError("set index directory checksum mismatch")
    spans = []

    def part_bytes(offset, length, crc, what):
        if offset + length > len(parts):
            raise FormatError(f"{what} lies past the end of the set index")
        b = parts[offset:offset + length]
        if crc32c(b) != crc:
            raise ChecksumError(f"{what}: checksum mismatch")
        spans.append((offset, length))
        return b

    def part(c, what):
        return part_bytes(_varint(c), _varint(c), c.u32(), what)

    def sequence(c, count, decode, what, numbers):
        form = c.u8()
        if form == 0:
            one = _text(c)
            return [whole(decode)(Cursor(one, what)) for _ in range(count)]
        if form == 1:
            if not numbers:
                raise FormatError(f"{what}: texts or lists as a progression")
            a, d = _varint(c), _varint(c)
            return [(a + n * d) % (1 << 64) for n in range(count)]
        if form != 2:
            raise FormatError(f"{what}: values of form {form}")
        per, offset, chunks = _varint(c), _varint(c), _varint(c)
        if per == 0 or chunks != -(-count // per):
            raise FormatError(f"{what}: {chunks} chunks of {per} for {count} values")
        values = []
        for j in range(chunks):
            length, crc = _varint(c), c.u32()
            chunk = Cursor(part_bytes(offset, length, crc, f"{what} chunk {j}"), what)
            offset += length
            for _ in range(min(per, count - j * per)):
                values.append(decode(chunk))
            chunk.end()
        if numbers:
            least, greatest = _varint(c), _varint(c)
            if least > greatest or any(not least <= v <= greatest for v in values):
                raise FormatError(f"{what}: values outside the stated bounds [{least}, {greatest}]")
        return values

    def whole(decode):
        def read(cur):
            v = decode(cur)
            cur.end()
            return v
        return read

    c = Cursor(directory, "set index directory")
    out = {"identity": _text(c), "world": _varint(c), "workers": _varint(c), "nodes": []}
    K = out["workers"]
    for _ in range(_varint(c)):
        n = Cursor(c.take(_varint(c)), "set index node")
        node = {"key": _text(n).decode(), "kind": _text(n).decode()}
        R, layout = _varint(n), n.u8()
        if R > out["world"] * K or (layout in (2, 3) and R > out["world"]):
            raise FormatError(f"node {node['key']!r}: {R} rows in a set of {out['world']} x {K}")
        if layout == 0:
            rc, ic = Cursor(part(n, "ranks"), "ranks"), Cursor(part(n, "instances"), "instances")
            ranks = [_varint(rc) for _ in range(R)]
            instances = [_varint(ic) for _ in range(R)]
            rc.end()
            ic.end()
            if any(r >= out["world"] for r in ranks):
                raise FormatError(f"node {node['key']!r}: a record of a rank past the set's")
        elif layout in (1, 2, 3):
            ranks = [i // K if layout == 1 else i for i in range(R)]
            instances = [i * K if layout == 2 else i for i in range(R)]
        else:
            raise FormatError(f"node {node['key']!r}: rows layout {layout}")
        mode = n.u8()
        modes = list(part(n, "modes")) if mode == 0 else [mode] * R
        if len(modes) != R or any(m not in STATE_MODES for m in modes):
            raise FormatError(f"node {node['key']!r}: modes {sorted(set(modes))} for {R} rows")
        rows = [{"rank": ranks[i], "instance": instances[i], "mode": STATE_MODES[modes[i]], "fields": {}}
                for i in range(R)]
        for _ in range(_varint(n)):
            name, t = _text(n).decode(), n.u8()
            if t not in FIELD_TYPES:
                raise FormatError(f"field {name!r}: type {t}")
            tag = _text(n).decode() if t == 4 else None
            present = [1] * R if n.u8() == 1 else list(part(n, f"presence of {name!r}"))
            if len(present) != R or any(p > 1 for p in present):
                raise FormatError(f"field {name!r}: presence flags")
            count = sum(present)
            what = f"field {name!r}"
            if t == 3:
                values = sequence(n, count, lambda cur: _text(cur).decode("utf-8", errors="surrogateescape"), what, False)
            else:
                values = sequence(n, count, _varint, what, True)
                if t == 2:
                    values = [v - (1 << 64) if v >= 1 << 63 else v for v in values]
            if t == 4:
                counts = values
                lists = iter(counts)
                values = sequence(n, count, lambda cur: _index_list(cur, next(lists)), what, False)
            values = iter(values)
            for i in range(R):
                if present[i]:
                    rows[i]["fields"][name] = (FIELD_TYPES[t], tag, next(values))
        n.end()
        node["rows"] = rows
        out["nodes"].append(node)
    c.end()
    at = 0
    for offset, length in sorted(spans):
        if offset != at:
            raise FormatError(f"the set index's parts leave bytes [{at}, {offset}) unread")
        at = offset + length
    if at != len(parts):
        raise FormatError(f"the set index's parts leave bytes [{at}, {len(parts)}) unread")
    return out


def check_set_index(index, rank_files):
    """That the index says what the rank files (rank r's path at index r) hold: every record once, its
    fields and values, and every list named by place found there with its checksum."""
    seen = {}
    for node in index["nodes"]:
        for row in node["rows"]:
            seen[(node["key"], row["instance"])] = (node, row)
    total = 0
    for r, path in enumerate(rank_files):
        with open(path, "rb") as f:
            data = f.read()
        for s in read_snapshot(data)["states"]:
            total += 1
            node, row = seen[(s["key"], s["instance"])]
            where = f"node {s['key']!r} instance {s['instance']}"
            if (node["kind"], row["rank"], row["mode"]) != (s["kind"], r, s["mode"]):
                raise FormatError(f"the index and rank {r} differ on {where}")
            # A rescale drops a node's input count, so the index leaves it out.
            fields = [f for f in s["fields"] if f["name"] != INPUT_TAKEN]
            if [f["name"] for f in fields] != list(row["fields"]):
                raise FormatError(f"the index and rank {r} give {where} other fields")
            for f in fields:
                t, tag, value = row["fields"][f["name"]]
                if t != f["type"]:
                    raise FormatError(f"field {f['name']!r} of {where} has another type in the index")
                if t != "elements":
                    if value != f["value"]:
                        raise FormatError(f"field {f['name']!r} of {where}: {value!r} in the index, {f['value']!r} in the file")
                    continue
                encoded = b"".join(struct.pack("<Q", len(b)) for b in f["blobs"]) + b"".join(f["blobs"])
                if tag != f["tag"] or value["count"] != len(f["blobs"]):
                    raise FormatError(f"list {f['name']!r} of {where} differs in tag or count")
                if "blobs" in value:
                    limit = POSITION_LIST_BYTES if tag == "u64" else VALUE_LIST_BYTES
                    if value["blobs"] != f["blobs"] or (f["blobs"] and len(encoded) > limit):
                        raise FormatError(f"the values of list {f['name']!r} of {where} differ")
                else:
                    stored = data[value["offset"]:value["offset"] + value["length"]]
                    if crc32c(stored) != value["crc"]:
                        raise ChecksumError(f"list {f['name']!r} of {where}: checksum mismatch at its place")
                    if stored != encoded:
                        raise FormatError(f"list {f['name']!r} of {where} is not where the index says")
    if total != len(seen):
        raise FormatError(f"the index holds {len(seen)} records, the rank files {total}")


def encode_state_index(states, list_offsets):
    """Section 5 for `states`, whose element lists' lengths start at `list_offsets` (file offsets, in order)."""
    spans = iter(list_offsets)

    def element_list(f, out):
        encoded = b"".join(struct.pack("<Q", len(b)) for b in f["blobs"]) + b"".join(f["blobs"])
        off = next(spans)
        if len(encoded) > INLINE_LIST_BYTES:
            out.append(struct.pack("<BQQI", 1, off, len(encoded), crc32c(encoded)))
        else:
            out += [b"\x00", encoded]
    return _encode_records(states, element_list)


# ---- native element encodings ----

_FIXED = {"i8": "<b", "u8": "<B", "i16": "<h", "u16": "<H", "i32": "<i", "u32": "<I", "i64": "<q",
          "u64": "<Q", "f32": "<f", "f64": "<d"}


def parse_tag(tag):
    """'vec<tup<i64,str>>' -> ('vec', [('tup', [('i64', []), ('str', [])])])."""
    pos = 0

    def node(depth):
        nonlocal pos
        if depth > 64:
            raise NotNative(tag)
        start = pos
        while pos < len(tag) and tag[pos] not in "<,>":
            pos += 1
        name = tag[start:pos]
        if not name:
            raise NotNative(tag)
        args = []
        if pos < len(tag) and tag[pos] == "<":
            pos += 1
            while True:
                args.append(node(depth + 1))
                if pos >= len(tag):
                    raise NotNative(tag)
                if tag[pos] == ",":
                    pos += 1
                    continue
                if tag[pos] == ">":
                    pos += 1
                    break
                raise NotNative(tag)
        return (name, args)

    t = node(0)
    if pos != len(tag):
        raise NotNative(tag)
    return t


def _decode(t, c):
    name, args = t
    if not args:
        if name in _FIXED:
            return c.unpack(_FIXED[name])
        if name == "bool":
            return c.u8() != 0
        if name == "str":
            return c.string()
        if name == "text_block":
            text = c.blob()
            ends = [c.u64() for _ in range(c.count(8))]
            lines, begin, finished = [], 0, False
            for i, e in enumerate(ends):
                if e < begin or e > len(text):
                    raise FormatError(f"text block line {i} ends outside the text")
                if b"\n" in text[begin:e]:
                    raise FormatError(f"text block line {i} holds a newline")
                line = text[begin:e]
                lines.append((line[:-1] if line.endswith(b"\r") else line).decode("utf-8", errors="surrogateescape"))
                if e == len(text):
                    if i + 1 != len(ends):
                        raise FormatError(f"text block line {i} ends the text but is not the last line")
                    finished = True
                    break
                if text[e:e + 1] != b"\n":
                    raise FormatError(f"text block line {i} does not end at a newline")
                begin = e + 1
            if not finished and begin != len(text):
                raise FormatError("bytes follow the last line of a text block")
            return lines
        raise NotNative(name)
    if name == "vec" and len(args) == 1:
        return [_decode(args[0], c) for _ in range(c.count(1))]
    if name == "tup":
        return [_decode(a, c) for a in args]
    if name == "opt" and len(args) == 1:
        flag = c.u8()
        if flag == 0:
            return None
        if flag != 1:
            raise FormatError(f"an optional's flag is {flag}")
        return _decode(args[0], c)
    raise NotNative(name)


def varint(c):
    """LEB128: 7 bits a byte, low first; the high bit set on every byte but the last."""
    v, shift = 0, 0
    while True:
        b = c.u8()
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise FormatError("a varint runs past 64 bits")
    if v >= 1 << 64:
        raise FormatError("a varint runs past 64 bits")
    return v


def decode_key(c):
    """A restore key (version 7 on), in varints: its base elements (source index, epoch, position,
    offsets), then the u32 CRC-32C of the element's bytes. Version 8 on, a key that starts with 0 is
    extended: after the count, each base element adds its group starts and a slice flag, 1 followed by
    the slice's begin and length."""
    n = varint(c)
    extended = n == 0
    if extended:
        n = varint(c)
    bases = []
    for _ in range(n):
        source, epoch, position = varint(c), varint(c), varint(c)
        offsets = [varint(c) for _ in range(varint(c))]
        base = {"source": source, "epoch": epoch, "position": position, "offsets": offsets}
        if extended:
            base["starts"] = varint(c)
            flag = varint(c)
            if flag not in (0, 1):
                raise FormatError(f"a restore key's slice flag is {flag}")
            if flag:
                begin, length = varint(c), varint(c)
                if length == 0:
                    raise FormatError("a restore key's slice of no token")
                base["tokens"] = [begin, begin + length]
        bases.append(base)
    if not bases:
        raise FormatError("a restore key of no base element")
    return {"key": bases, "checksum": c.u32()}


def decode_element(tag, blob):
    """One element blob decoded from its type tag; NotNative for tags without a native encoding. An entry
    of a keyed list (tag "keys:" + the element's, version 7 on) is {"key": ..., "checksum": ...} or
    {"data": the element}."""
    if tag.startswith("keys:"):
        c = Cursor(blob, f"entry of a list of type {tag}")
        kind = bytes(blob[:1])
        if kind == b"k":
            c.take(1)
            v = decode_key(c)
            c.end()
            return v
        if kind == b"v":
            return {"data": decode_element(tag[5:], blob[1:])}
        raise FormatError(f"an entry of a keyed list starts with {kind!r}")
    t = parse_tag(tag)
    c = Cursor(blob, f"element of type {tag}")
    v = _decode(t, c)
    c.end()
    return v


def key_as_shown(entry, graph_keys):
    """A keyed list's entry as `dpipe snapshot show` writes it: {"key": [[SOURCE, POSITION(, {"epoch",
    "offsets", "tokens"})], ...], "crc32c": N} with SOURCE the graph key of the source's index, or {"data": value}."""
    if "data" in entry:
        return entry
    sources = []
    for b in entry["key"]:
        pair = [graph_keys[b["source"]] if b["source"] < len(graph_keys) else "?", b["position"]]
        extra = {}
        if b["epoch"]:
            extra["epoch"] = b["epoch"]
        if b["offsets"]:
            extra["offsets"] = b["offsets"]
        if "tokens" in b:
            extra["tokens"] = b["tokens"]
        sources.append(pair + [extra] if extra else pair)
    return {"key": sources, "crc32c": entry["checksum"]}


def field_values(field, graph_keys=None):
    """A field's value: the number or string, or the list of decoded elements (hex for opaque ones); with
    `graph_keys` (the snapshot's graph keys in order), a keyed list's entries as `snapshot show` writes them."""
    if field["type"] != "elements":
        return field["value"]
    out = []
    for b in field["blobs"]:
        try:
            v = decode_element(field["tag"], b)
            out.append(key_as_shown(v, graph_keys) if graph_keys is not None and field["tag"].startswith("keys:") else v)
        except NotNative:
            out.append("0x" + b.hex())
    return out


# ---- writing (for round trips in the test, and for the layout without node details) ----

def _str(b):
    b = b if isinstance(b, bytes) else b.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(b)) + b


def encode_meta(m, sort_metadata=True):
    out = [struct.pack("<QQQiiiQ", m["fingerprint"], m["seed"], m["epoch"], m["layout"]["rank"],
                       m["layout"]["world_size"], m["layout"]["num_workers"], m["elements_delivered"]),
           struct.pack("<Q", len(m["graph"]))]
    for n in m["graph"]:
        out += [_str(n["key"]), _str(n["kind"]), _str(n["element_type"])]
    out.append(struct.pack("<Q", len(m["user_metadata"])))
    for k in (sorted(m["user_metadata"]) if sort_metadata else m["user_metadata"]):
        out += [_str(k), _str(m["user_metadata"][k])]
    return b"".join(out)


def encode_node_details(graph):
    out = [struct.pack("<Q", len(graph))]
    for n in graph:
        out += [_str(n["segment"]), struct.pack("<Q", len(n["params"]))]
        out += [_str(k) + _str(v) for k, v in n["params"]]
    return b"".join(out)


def _encode_records(states, element_list):
    """The node records as sections 2 and 5 both write them; `element_list(field, out)` appends what
    follows an elements field's tag and count to the list of byte strings `out`."""
    modes = {v: k for k, v in STATE_MODES.items()}
    out = [struct.pack("<Q", len(states))]
    for s in states:
        out += [_str(s["key"]), _str(s["kind"]), struct.pack("<IBQ", s["instance"], modes[s["mode"]], len(s["fields"]))]
        for f in s["fields"]:
            out.append(_str(f["name"]))
            if f["type"] == "u64":
                out.append(struct.pack("<BQ", 1, f["value"]))
            elif f["type"] == "i64":
                out.append(struct.pack("<Bq", 2, f["value"]))
            elif f["type"] == "str":
                out.append(b"\x03" + _str(f["value"]))
            else:
                out += [b"\x04", _str(f["tag"]), struct.pack("<Q", len(f["blobs"]))]
                element_list(f, out)
    return b"".join(out)


def encode_states(states, list_offsets=None):
    """Section 2; appends to `list_offsets` where each element list's lengths start in it."""
    def element_list(f, out):
        if list_offsets is not None:
            list_offsets.append(sum(len(x) for x in out))
        out += [struct.pack("<Q", len(b)) for b in f["blobs"]]
        out += f["blobs"]
    return _encode_records(states, element_list)


def write_snapshot(snap, node_details=True, version=None, identity=None, sort_metadata=True, index_states=None):
    """Bytes of `snap` (a read_snapshot dict) laid out as dpipe lays out its files: from version 2 the
    identity section 4 first; then sections 1, 2 and, when node_details and every graph node has a
    segment, 3 (version 3: 1, 3, 2, then the state index 5), contiguous after the table. `version`
    defaults to the one `snap` was read with. For crafted files: `identity`, the raw bytes of section 4;
    `sort_metadata=False` writes the user metadata in the dict's order; `index_states`, the records section
    5 says (section 2's by default)."""
    meta = snap["meta"]
    if version is None:
        version = snap["header"]["format_version"]
    list_offsets = []
    states = encode_states(snap["states"], list_offsets)
    bodies = [(SECTION_META, encode_meta(meta, sort_metadata)), (SECTION_STATES, states)]
    if version >= 2:
        step = meta.get("step")
        ident = identity or struct.pack("<QBQ", meta.get("id", 0), 0 if step is None else 1, step or 0)
        bodies.insert(0, (SECTION_IDENTITY, ident))
    if node_details and all("segment" in n for n in meta["graph"]):
        details = (SECTION_NODE_DETAILS, encode_node_details(meta["graph"]))
        bodies.insert(len(bodies) - 1 if version >= 3 else len(bodies), details)
    if version >= 3:
        states_at = HEADER_BYTES + SECTION_ENTRY_BYTES * (len(bodies) + 1) + sum(len(b) for _, b in bodies[:-1])
        indexed = snap["states"] if index_states is None else index_states
        bodies.append((SECTION_STATE_INDEX, encode_state_index(indexed, [states_at + o for o in list_offsets])))
    offset = HEADER_BYTES + SECTION_ENTRY_BYTES * len(bodies)
    table = b""
    for sid, body in bodies:
        table += struct.pack("<IIQQ", sid, crc32c(body), offset, len(body))
        offset += len(body)
    head = MAGIC + struct.pack("<IIQI", version, len(bodies), offset, crc32c(table))
    return head + struct.pack("<I", crc32c(head)) + table + b"".join(b for _, b in bodies)
