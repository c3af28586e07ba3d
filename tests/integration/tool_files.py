"""Data files for the tool's tests, written from their formats' definitions (standard library only)."""
import struct


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82f63b78 & -(c & 1))
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data):
    crc = 0xffffffff
    for b in data:
        crc = (crc >> 8) ^ _CRC32C[(crc ^ b) & 0xff]
    return crc ^ 0xffffffff


def masked_crc32c(data):
    """The TFRecord checksum: CRC-32C rotated right by 15 bits plus a constant."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff


def tfrecord(data, good=True):
    """One TFRecord frame of `data`; good=False spoils its data checksum."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + \
        struct.pack("<I", masked_crc32c(data) ^ (0 if good else 1))


def write_tfrecords(path, records):
    with open(path, "wb") as f:
        f.write(b"".join(tfrecord(r) for r in records))


def write_tokens(path, tokens, dtype="uint16"):
    """A headerless little-endian token file (nanoGPT's .bin)."""
    code = {"uint16": "H", "uint32": "I"}[dtype]
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}{code}", *tokens))
