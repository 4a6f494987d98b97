//! A picture for the PNG exports: cells, axes' labels and a legend drawn into RGB pixels, text
//! in the public-domain 8x8 bitmap font (`font8x8`): a PNG opened on its own says what it
//! shows, as the SVG does, with no font or renderer on the machine.

use std::io::Write;

use font8x8::UnicodeFonts;

use super::ExportError;

/// Pixels a character takes, across and down (8 px of glyph, 2 between lines).
pub const CHAR_W: usize = 8;
pub const LINE_H: usize = 10;
pub const INK: [u8; 3] = [40, 40, 40];

pub struct Canvas {
    pub width: usize,
    pub height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Self {
        let (width, height) = (width.max(1), height.max(1));
        Self { width, height, pixels: vec![255; width * height * 3] }
    }

    /// Fills `w x h` pixels from (`x`, `y`), clipped to the canvas.
    pub fn fill(&mut self, x: usize, y: usize, w: usize, h: usize, rgb: [u8; 3]) {
        for yy in y..(y + h).min(self.height) {
            for xx in x..(x + w).min(self.width) {
                let at = (yy * self.width + xx) * 3;
                self.pixels[at..at + 3].copy_from_slice(&rgb);
            }
        }
    }

    /// Writes `text` with its top left at (`x`, `y`), clipped; a character the font lacks (or a
    /// control character: names come from the machine) is drawn as `?`.
    pub fn text(&mut self, x: usize, y: usize, text: &str, rgb: [u8; 3]) {
        for (i, ch) in text.chars().enumerate() {
            let glyph = if ch.is_control() { None } else { font8x8::BASIC_FONTS.get(ch) };
            let glyph = glyph.or_else(|| font8x8::BASIC_FONTS.get('?')).unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits >> col & 1 == 1 {
                        self.fill(x + i * CHAR_W + col, y + row, 1, 1, rgb);
                    }
                }
            }
        }
    }

    /// Writes `text` so that it ends at `right`.
    pub fn text_right(&mut self, right: usize, y: usize, text: &str, rgb: [u8; 3]) {
        self.text(right.saturating_sub(text_px(text)), y, text, rgb);
    }

    pub fn write_png(&self, out: impl Write) -> Result<(), ExportError> {
        super::write_rgb_png(self.width, self.height, &self.pixels, out)
    }

    #[cfg(test)]
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let at = (y * self.width + x) * 3;
        [self.pixels[at], self.pixels[at + 1], self.pixels[at + 2]]
    }
}

/// Pixels `text` takes across.
pub fn text_px(text: &str) -> usize {
    text.chars().count() * CHAR_W
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_drawn_in_ink_and_clipped_at_the_edge() {
        let mut c = Canvas::new(20, 10);
        c.text(0, 0, "1 s", INK);
        // '1' has ink in its 8x8 cell; past the canvas nothing is drawn (no panic).
        assert!((0..8).any(|x| (0..8).any(|y| c.pixel(x, y) == INK)));
        assert!((8..16).all(|x| (0..8).all(|y| c.pixel(x, y) == [255; 3])), "a space is blank");
        c.text_right(20, 0, "\u{1b}[31m long name", INK);
    }
}
