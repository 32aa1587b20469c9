//! A record's keywords: a list of strings held as one string and the end of each keyword in
//! it.
//!
//! A record that was written without keywords holds its text's ~50 tokens. As one `String`
//! each, every write would allocate and free hundreds of small strings (tokenizing each
//! candidate, decoding each record it reads), and glibc's allocator spends a third of the
//! writers' time on such strings and on consolidating what they leave behind. Held here, a list
//! is three allocations whatever its length, and a copy of a record copies one pointer.
//!
//! **Invariants:** `ends` is non-decreasing and its last element (if any) is `joined.len()`;
//! every end falls on a character boundary of `joined`. Only the constructors below build a
//! value, and each keeps them.

use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A list of keywords, in order, repeats and empty strings kept. Cloning shares it.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Keywords(Arc<Inner>);

#[derive(Default, PartialEq, Eq, Hash)]
struct Inner {
    joined: String,
    ends: Vec<u32>,
}

/// Builds a [`Keywords`] one keyword at a time.
#[derive(Default)]
pub struct KeywordsBuilder(Inner);

impl KeywordsBuilder {
    /// Room for `count` keywords of `bytes` bytes in all.
    pub fn with_capacity(count: usize, bytes: usize) -> KeywordsBuilder {
        KeywordsBuilder(Inner {
            joined: String::with_capacity(bytes),
            ends: Vec::with_capacity(count),
        })
    }

    /// Appends one keyword. A list is at most a request body or a record read back, far below
    /// 4 GiB; a keyword that would end past what a `u32` names is left out rather than
    /// misplaced.
    pub fn push(&mut self, keyword: &str) {
        let Ok(end) = u32::try_from(self.0.joined.len() + keyword.len()) else {
            return;
        };
        self.0.joined.push_str(keyword);
        self.0.ends.push(end);
    }

    /// The list built.
    pub fn finish(self) -> Keywords {
        Keywords(Arc::new(self.0))
    }
}

impl Keywords {
    /// No keywords.
    pub fn new() -> Keywords {
        Keywords::default()
    }

    /// How many keywords.
    pub fn len(&self) -> usize {
        self.0.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.ends.is_empty()
    }

    /// The keyword at `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.0.ends.get(i)? as usize;
        let start = match i.checked_sub(1) {
            Some(p) => *self.0.ends.get(p)? as usize,
            None => 0,
        };
        self.0.joined.get(start..end)
    }

    /// The keywords in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            keywords: self,
            next: 0,
            back: self.len(),
        }
    }

    /// The bytes of all keywords together.
    pub fn total_len(&self) -> usize {
        self.0.joined.len()
    }

    /// The keywords joined by `sep`, as `[String]::join` joins them.
    pub fn join(&self, sep: &str) -> String {
        let mut out = String::with_capacity(self.total_len() + sep.len() * self.len());
        for (i, k) in self.iter().enumerate() {
            if i > 0 {
                out.push_str(sep);
            }
            out.push_str(k);
        }
        out
    }

    /// The keywords as owned strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

/// The keywords of a [`Keywords`], in order.
#[derive(Clone)]
pub struct Iter<'a> {
    keywords: &'a Keywords,
    next: usize,
    back: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.next >= self.back {
            return None;
        }
        let k = self.keywords.get(self.next);
        self.next += 1;
        k
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.next;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.next >= self.back {
            return None;
        }
        self.back -= 1;
        self.keywords.get(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Keywords {
    type Item = &'a str;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Keywords {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Keywords {
        let mut b = KeywordsBuilder::default();
        for k in iter {
            b.push(k.as_ref());
        }
        b.finish()
    }
}

impl From<Vec<String>> for Keywords {
    fn from(v: Vec<String>) -> Keywords {
        Keywords::from(v.as_slice())
    }
}

impl From<&[String]> for Keywords {
    fn from(v: &[String]) -> Keywords {
        let mut b = KeywordsBuilder::with_capacity(v.len(), v.iter().map(String::len).sum());
        for k in v {
            b.push(k);
        }
        b.finish()
    }
}

impl<const N: usize> From<[&str; N]> for Keywords {
    fn from(v: [&str; N]) -> Keywords {
        v.into_iter().collect()
    }
}

impl fmt::Debug for Keywords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for Keywords {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for Keywords {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Keywords {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

/// As a list of strings: the same bytes as a `Vec<String>` in every serde format, so stores
/// and wire answers written before this type read the same.
impl Serialize for Keywords {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Keywords {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Keywords, D::Error> {
        d.deserialize_seq(ListVisitor)
    }
}

struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = Keywords;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Keywords, A::Error> {
        // A hint is the sender's claim: bounded, so a corrupt length cannot reserve much.
        let count = seq.size_hint().unwrap_or(0).min(1024);
        let mut b = KeywordsBuilder::with_capacity(count, count * 8);
        // Each string is appended where the format hands it over: no string per keyword.
        while seq.next_element_seed(Append(&mut b))?.is_some() {}
        Ok(b.finish())
    }
}

/// Appends one string of a list to the builder.
struct Append<'b>(&'b mut KeywordsBuilder);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Append<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_order_repeats_and_empty_strings() {
        let k: Keywords = ["npm", "", "Café", "npm"].into();
        assert_eq!(k.len(), 4);
        assert_eq!(k.iter().collect::<Vec<_>>(), ["npm", "", "Café", "npm"]);
        assert_eq!(
            k.iter().rev().collect::<Vec<_>>(),
            ["npm", "Café", "", "npm"]
        );
        assert_eq!((k.get(2), k.get(4)), (Some("Café"), None));
        assert_eq!(k, ["npm", "", "Café", "npm"]);
        assert_ne!(k, ["npm", "", "Café"]);
        assert_eq!(k.to_vec(), ["npm", "", "Café", "npm"]);
        assert_eq!(k.join(" "), ["npm", "", "Café", "npm"].join(" "));
        assert_eq!(format!("{k:?}"), r#"["npm", "", "Café", "npm"]"#);
        // Equal lists are equal however they were split: "ab" + "c" is not "a" + "bc".
        let ab_c: Keywords = ["ab", "c"].into();
        let a_bc: Keywords = ["a", "bc"].into();
        assert_ne!(ab_c, a_bc);
        assert!(Keywords::new().is_empty());
        assert_eq!(Keywords::new().iter().next(), None);
    }

    proptest::proptest! {
        #[test]
        fn a_list_reads_as_a_vec_of_strings_in_postcard_and_json(
            list in proptest::collection::vec("(?s).{0,12}", 0..24)
        ) {
            let k = Keywords::from(list.clone());
            proptest::prop_assert_eq!(k.to_vec(), list.clone());
            let bytes = postcard::to_allocvec(&k).expect("encode");
            proptest::prop_assert_eq!(&bytes, &postcard::to_allocvec(&list).expect("encode"));
            let back: Keywords = postcard::from_bytes(&bytes).expect("decode");
            proptest::prop_assert_eq!(&back, &k);
            let json = serde_json::to_string(&k).expect("json");
            proptest::prop_assert_eq!(&json, &serde_json::to_string(&list).expect("json"));
            let back: Keywords = serde_json::from_str(&json).expect("json");
            proptest::prop_assert_eq!(back, k);
        }
    }

    #[test]
    fn a_list_refuses_what_is_not_a_list_of_strings() {
        assert!(serde_json::from_str::<Keywords>(r#"["a", 1]"#).is_err());
        assert!(serde_json::from_str::<Keywords>(r#""a""#).is_err());
        assert!(serde_json::from_str::<Keywords>("null").is_err());
        // A truncated postcard list is an error, not a shorter list.
        let bytes = postcard::to_allocvec(&["npm", "ci"]).expect("encode");
        assert!(postcard::from_bytes::<Keywords>(&bytes[..bytes.len() - 1]).is_err());
    }
}
