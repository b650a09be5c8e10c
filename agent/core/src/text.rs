//! Cutting text to a byte limit: the API server refuses a whole object (an Event, a status)
//! when one of its strings is longer than the schema allows, so what kuport writes is cut to
//! fit beforehand, on a character boundary, with a mark that says it was cut.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

/// What a cut text ends with.
pub const CUT_MARK: &str = "…";

/// `text` when it fits in `max` bytes; else its longest head that fits together with
/// [`CUT_MARK`], cut on a character boundary. With `max` smaller than the mark, the head alone.
pub fn cut_bytes(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mark = if max >= CUT_MARK.len() { CUT_MARK } else { "" };
    let mut end = max - mark.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{mark}", &text[..end]))
}

/// The first 8 hex digits of the text's sha256: identical on every node, short enough for
/// interface names (15 bytes) and nft names, and to tell apart two long texts cut alike.
pub fn short_hash(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(8);
    for b in &digest[..4] {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_fits_is_left_alone() {
        assert!(matches!(cut_bytes("abc", 3), Cow::Borrowed("abc")));
        assert_eq!(cut_bytes("", 0), "");
    }

    #[test]
    fn a_cut_fits_the_limit_on_a_character_boundary_and_says_so() {
        assert_eq!(cut_bytes("abcdef", 5), "ab…");
        // "é" is two bytes: a cut never splits it.
        let text = "ééééé";
        for max in 3..text.len() {
            let cut = cut_bytes(text, max);
            assert!(cut.len() <= max, "{max}: {cut:?}");
            assert!(cut.ends_with(CUT_MARK), "{max}: {cut:?}");
            assert!(max - cut.len() < 2, "{max}: {cut:?} wastes room");
        }
        assert_eq!(cut_bytes("abcdef", 2), "ab");
        assert_eq!(cut_bytes("éé", 1), "");
    }
}
